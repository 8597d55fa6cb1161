"""Print a gpu-k8s bootstrap secret from AWS Secrets Manager to stdout (run at first boot, as root).

Usage: python3 fetch_secret.py <secret name or ARN> | python3 write_secret_files.py

The node authenticates with its instance profile (aws_api.py, beside this script). Errors name their type
only, never a value.
"""

import sys

from aws_api import call, instance_credentials


def secret_value(secret_id):
    region, credentials = instance_credentials()
    answer = call(
        f"secretsmanager.{region}.amazonaws.com",
        "secretsmanager",
        region,
        "secretsmanager.GetSecretValue",
        credentials,
        {"SecretId": secret_id},
    )
    return answer["SecretString"]


def main():
    try:
        sys.stdout.write(secret_value(sys.argv[1]))
    except (OSError, ValueError, KeyError) as error:
        # The instance profile's credentials can take a moment to appear after boot; the caller retries.
        print(f"gpu-k8s: reading {sys.argv[1]} failed ({type(error).__name__})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
