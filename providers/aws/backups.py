"""Where a k3s cluster on EC2 keeps its etcd snapshots: a private, encrypted, versioned S3 bucket the servers
write with their instance role."""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pulumi_aws as aws

from gpu_k8s.components.k3s.cloudinit import SnapshotStore
from gpu_k8s.providers.aws.iam import POLICY_VERSION

# Snapshots k3s prunes (retention) or overwrites stay recoverable this long as noncurrent versions.
NONCURRENT_DAYS = 30


def snapshot_access_policy(bucket_arn: str) -> dict[str, Any]:
    """What k3s's snapshot client does (k3s pkg/etcd/s3: bucket check, list, upload, download, prune):
    list the bucket, read, write and delete its objects; nothing else, nowhere else."""
    return {
        "Version": POLICY_VERSION,
        "Statement": [
            {"Sid": "ListSnapshots", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": bucket_arn},
            {
                "Sid": "ReadWriteSnapshots",
                "Effect": "Allow",
                "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
                "Resource": f"{bucket_arn}/*",
            },
        ],
    }


def tls_only_policy(bucket_arn: str) -> dict[str, Any]:
    return {
        "Version": POLICY_VERSION,
        "Statement": [
            {
                "Sid": "DenyPlainHttp",
                "Effect": "Deny",
                "Principal": "*",
                "Action": "s3:*",
                "Resource": [bucket_arn, f"{bucket_arn}/*"],
                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
            }
        ],
    }


class SnapshotBucket(pulumi.ComponentResource):
    """The bucket, closed to the public and to plain HTTP, encrypted at rest, versioned, with old versions
    expiring. It survives `pulumi destroy` (retainOnDelete): a destroyed cluster's last snapshots are what a
    restore needs; delete the bucket by hand once they are not."""

    bucket: aws.s3.Bucket
    store: pulumi.Output[SnapshotStore]
    # What must exist before a server's first snapshot.
    ready: list[pulumi.Resource]

    def __init__(self, name: str, cluster_name: str, region: str, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpu-k8s:aws:SnapshotBucket", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.bucket = aws.s3.Bucket(
            name,
            bucket_prefix=f"{cluster_name}-etcd-",
            tags={"Name": f"{cluster_name}-etcd-snapshots"},
            opts=pulumi.ResourceOptions(parent=self, retain_on_delete=True),
        )
        bucket = self.bucket.id
        self.ready = [
            aws.s3.BucketPublicAccessBlock(
                f"{name}-no-public-access",
                bucket=bucket,
                block_public_acls=True,
                block_public_policy=True,
                ignore_public_acls=True,
                restrict_public_buckets=True,
                opts=child,
            ),
            aws.s3.BucketOwnershipControls(
                f"{name}-owner",
                bucket=bucket,
                rule=aws.s3.BucketOwnershipControlsRuleArgs(object_ownership="BucketOwnerEnforced"),
                opts=child,
            ),
            aws.s3.BucketServerSideEncryptionConfiguration(
                f"{name}-encryption",
                bucket=bucket,
                rules=[{"apply_server_side_encryption_by_default": {"sse_algorithm": "AES256"}}],
                opts=child,
            ),
            aws.s3.BucketVersioning(
                f"{name}-versioning",
                bucket=bucket,
                versioning_configuration=aws.s3.BucketVersioningVersioningConfigurationArgs(status="Enabled"),
                opts=child,
            ),
            aws.s3.BucketPolicy(
                f"{name}-tls-only",
                bucket=bucket,
                policy=self.bucket.arn.apply(lambda arn: json.dumps(tls_only_policy(arn))),
                opts=child,
            ),
        ]
        aws.s3.BucketLifecycleConfiguration(
            f"{name}-lifecycle",
            bucket=bucket,
            rules=[
                {
                    "id": "expire-old-snapshot-versions",
                    "status": "Enabled",
                    "filter": {"prefix": ""},
                    "noncurrent_version_expiration": {"noncurrent_days": NONCURRENT_DAYS},
                    "abort_incomplete_multipart_upload": {"days_after_initiation": 1},
                }
            ],
            opts=pulumi.ResourceOptions(parent=self, depends_on=self.ready),
        )
        self.store = bucket.apply(
            lambda name_: SnapshotStore(
                endpoint=f"s3.{region}.amazonaws.com", region=region, bucket=name_, folder=cluster_name
            )
        )
        self.register_outputs({"bucket": bucket})
