"""Where a k3s cluster on Compute Engine keeps its etcd snapshots: a private, versioned Cloud Storage bucket
the servers write through its S3-compatible XML API with an HMAC key of their service account (k3s speaks
only the S3 API; minio-go, its client, signs with SigV4, which Cloud Storage's interoperability accepts for
HMAC keys; not run against Cloud Storage here, UNCONFIRMED end to end)."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_gcp as gcp

from gpu_k8s.components.k3s.cloudinit import SnapshotStore, etcd_s3_credentials
from gpu_k8s.providers.gcp.iam import NodeServiceAccount, custom_role

ENDPOINT = "storage.googleapis.com"
# What k3s's snapshot client does (k3s pkg/etcd/s3: HEAD bucket, list, upload, download, prune).
SNAPSHOT_PERMISSIONS = (
    "storage.buckets.get",
    "storage.objects.list",
    "storage.objects.get",
    "storage.objects.create",
    "storage.objects.delete",
)
# Snapshots k3s prunes (retention) or overwrites stay recoverable this long as noncurrent versions.
NONCURRENT_DAYS = 30


class SnapshotBucket(pulumi.ComponentResource):
    """The bucket (uniform access, public access prevented, versioned, old versions expiring, Google-managed
    encryption), a role on it alone for the servers, and their HMAC key. The bucket survives
    `pulumi destroy` (retainOnDelete): a destroyed cluster's last snapshots are what a restore needs."""

    store: pulumi.Output[SnapshotStore]
    # The servers' secret's extra file: the HMAC key as k3s settings.
    credentials: pulumi.Output[dict[str, str]]
    # What must exist before a server's first snapshot.
    ready: list[pulumi.Resource]

    def __init__(
        self,
        name: str,
        cluster_name: str,
        project: str,
        region: str,
        writer: NodeServiceAccount,
        after: Sequence[pulumi.Resource] = (),
        opts: pulumi.ResourceOptions | None = None,
    ):
        """`after`: what the bucket, its key and role wait for (the Cloud Storage and IAM APIs). A
        component's own depends_on does not reach its children, so they take it themselves."""
        super().__init__("gpu-k8s:gcp:SnapshotBucket", name, None, opts)
        child = pulumi.ResourceOptions(parent=self, depends_on=list(after))
        bucket = gcp.storage.Bucket(
            name,
            location=region,
            uniform_bucket_level_access=True,
            public_access_prevention="enforced",
            versioning={"enabled": True},
            lifecycle_rules=[
                {
                    "action": {"type": "Delete"},
                    "condition": {"days_since_noncurrent_time": NONCURRENT_DAYS, "with_state": "ARCHIVED"},
                }
            ],
            labels={"gpu-k8s-purpose": "etcd-snapshots"},
            opts=pulumi.ResourceOptions(parent=self, retain_on_delete=True, depends_on=list(after)),
        )
        role = custom_role(
            f"{name}-role", project, f"etcd snapshots of {cluster_name}", SNAPSHOT_PERMISSIONS, self, after
        )
        access = gcp.storage.BucketIAMMember(
            f"{name}-writer", bucket=bucket.name, role=role.name, member=writer.member, opts=child
        )
        key = gcp.storage.HmacKey(
            f"{name}-key", service_account_email=writer.email, project=project, opts=child
        )
        self.credentials = pulumi.Output.secret(
            pulumi.Output.all(key.access_id, key.secret).apply(lambda parts: etcd_s3_credentials(*parts))
        )
        self.store = bucket.name.apply(
            lambda bucket_name: SnapshotStore(
                endpoint=ENDPOINT, region=region, bucket=bucket_name, folder=cluster_name
            )
        )
        self.ready = [access, key]
        self.register_outputs({"bucket": bucket.name})
