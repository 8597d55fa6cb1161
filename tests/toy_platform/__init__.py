"""A test-only platform: GPU nodes someone else runs (an existing cluster named by its kubeconfig context),
on the AWS catalog's instance types. Everything it needs is in this folder; DEVELOPERS.md "Add a platform"
walks through it, and tests/test_add_platform.py registers it."""
