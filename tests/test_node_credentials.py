"""The scripts an EC2 k3s node signs AWS requests with (stdlib SigV4), checked against botocore's signer and a
real AWS API (moto, which verifies signatures and the caller's IAM policy): the bootstrap secret fetch and the
kubelet's ECR credential provider of EFA agents."""

from __future__ import annotations

import datetime
import json
import sys
import urllib.error
from collections.abc import Iterator
from pathlib import Path

import botocore.auth
import botocore.awsrequest
import botocore.credentials
import botocore.session
import pytest

from gpu_k8s.components.k3s import paths
from gpu_k8s.providers.aws import k3s_agents
from gpu_k8s.providers.aws.efa import EFA_PLUGIN_REGISTRY, EFA_PLUGIN_REPOSITORY, efa_plugin_pull_policy
from gpu_k8s.providers.aws.files import aws_api
from gpu_k8s.providers.aws.k3s_bootstrap import FILES
from tests.conftest import ec2_cloud_config, upstream_yaml

CREDENTIALS = {
    "AccessKeyId": "AKIDEXAMPLE",
    "SecretAccessKey": "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
    "Token": "session-token",
}


@pytest.mark.parametrize(
    ("service", "host", "target"),
    [
        ("secretsmanager", "secretsmanager.eu-west-1.amazonaws.com", "secretsmanager.GetSecretValue"),
        (
            "ecr",
            "api.ecr.eu-west-1.amazonaws.com",
            "AmazonEC2ContainerRegistry_V20150921.GetAuthorizationToken",
        ),
    ],
)
def test_node_requests_are_signed_exactly_like_botocore(monkeypatch, service, host, target):
    body = json.dumps({"SecretId": "arn:aws:secretsmanager:eu-west-1:1:secret:x"}).encode()
    now = datetime.datetime(2026, 11, 30, 12, 0, 0, tzinfo=datetime.UTC)
    ours = aws_api.signed_headers(host, service, "eu-west-1", target, CREDENTIALS, body, now)
    request = botocore.awsrequest.AWSRequest(
        method="POST",
        url=f"https://{host}/",
        data=body,
        headers={"content-type": ours["content-type"], "x-amz-target": ours["x-amz-target"]},
    )
    signer = botocore.auth.SigV4Auth(
        botocore.credentials.Credentials("AKIDEXAMPLE", CREDENTIALS["SecretAccessKey"], "session-token"),
        service,
        "eu-west-1",
    )
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: now.replace(tzinfo=None))
    signer.add_auth(request)
    theirs = request.headers["Authorization"]
    assert ours["authorization"] == theirs
    # And the comparison can fail: a wrong region gives another signature.
    assert aws_api.signed_headers(host, service, "us-east-1", target, CREDENTIALS, body, now)[
        "authorization"
    ] != (theirs)


@pytest.fixture
def provider_module(monkeypatch) -> object:
    """The provider as the node runs it: beside aws_api.py, which it imports by that name."""
    monkeypatch.syspath_prepend(str(FILES))
    monkeypatch.delitem(sys.modules, "ecr_credential_provider", raising=False)
    import ecr_credential_provider

    return ecr_credential_provider


@pytest.fixture(scope="module")
def ecr() -> Iterator[tuple[str, dict[str, str], dict[str, str]]]:
    """A moto server on 127.0.0.1 that checks signatures and policies; yields its endpoint and the
    credentials of a role that may pull the plugin, and of one that may not."""
    from moto import settings
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    session = botocore.session.get_session()
    session.set_credentials("AKIASETUPSETUPSETUP1", "setup-secret")
    iam = session.create_client("iam", region_name="us-east-1", endpoint_url=endpoint)
    sts = session.create_client("sts", region_name="us-east-1", endpoint_url=endpoint)
    trust = {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}
        ],
    }

    def role(name: str, policy: dict | None) -> dict[str, str]:
        arn = iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"]
        if policy is not None:
            iam.put_role_policy(RoleName=name, PolicyName="pull", PolicyDocument=json.dumps(policy))
        assumed = sts.assume_role(RoleArn=arn, RoleSessionName="i-node")["Credentials"]
        return {
            "AccessKeyId": assumed["AccessKeyId"],
            "SecretAccessKey": assumed["SecretAccessKey"],
            "Token": assumed["SessionToken"],
        }

    pulls, cannot = role("efa-agent", efa_plugin_pull_policy()), role("other-agent", None)
    before = settings.INITIAL_NO_AUTH_ACTION_COUNT
    settings.INITIAL_NO_AUTH_ACTION_COUNT = 0
    try:
        yield endpoint, pulls, cannot
    finally:
        settings.INITIAL_NO_AUTH_ACTION_COUNT = before
        server.stop()


PLUGIN_IMAGE = f"{EFA_PLUGIN_REGISTRY}/{EFA_PLUGIN_REPOSITORY}:v0.5.20"


def test_the_credential_provider_answers_the_kubelet_with_an_ecr_token_for_the_plugins_registry(
    provider_module, ecr
):
    endpoint, pulls, _ = ecr
    request = {"kind": "CredentialProviderRequest", "apiVersion": "credentialprovider.kubelet.k8s.io/v1"}
    answer = provider_module.ecr_credentials({**request, "image": PLUGIN_IMAGE}, pulls, endpoint)
    assert answer["kind"] == "CredentialProviderResponse"
    assert answer["apiVersion"] == "credentialprovider.kubelet.k8s.io/v1"
    assert answer["cacheKeyType"] == "Registry"
    (registry, auth), *_ = answer["auth"].items()
    assert registry == EFA_PLUGIN_REGISTRY
    assert auth["username"] == "AWS" and auth["password"]
    assert set(answer["auth"]) == {registry}


def test_the_credential_provider_is_refused_without_the_pull_permission_or_with_a_wrong_key(
    provider_module, ecr
):
    endpoint, pulls, cannot = ecr
    request = {"image": PLUGIN_IMAGE}
    with pytest.raises(urllib.error.HTTPError) as no_grant:
        provider_module.ecr_credentials(request, cannot, endpoint)
    assert no_grant.value.code == 403
    wrong_key = {**pulls, "SecretAccessKey": pulls["SecretAccessKey"] + "x"}
    with pytest.raises(urllib.error.HTTPError) as wrong:
        provider_module.ecr_credentials(request, wrong_key, endpoint)
    assert wrong.value.code in (400, 403)


def test_the_credential_provider_takes_only_ecr_registries(provider_module):
    with pytest.raises(ValueError, match="not an ECR registry"):
        provider_module.ecr_credentials({"image": "public.ecr.aws/eks/x:1"}, CREDENTIALS)


def test_efa_agents_register_the_provider_with_the_kubelet_and_pull_only_the_plugin(aws_k3s_efa, aws_k3s):
    """The EFA pool's agents (and only they) write the provider config, link the provider into the kubelet's
    provider directory and pass both to the kubelet; their role may pull the plugin's repository only."""
    from tests.conftest import node_drop_in, user_data_files

    def agent_files(recording, template: str) -> dict[str, str]:
        user_data = ec2_cloud_config(recording.by_name(template).inputs)
        return user_data_files(user_data)

    train = agent_files(aws_k3s_efa, "ml-gpu-train-lt")
    config = json.loads(json.dumps(__import__("yaml").safe_load(train[paths.CREDENTIAL_PROVIDER_CONFIG])))
    assert config == {
        "apiVersion": "kubelet.config.k8s.io/v1",
        "kind": "CredentialProviderConfig",
        "providers": [
            {
                "name": "ecr-credential-provider",
                "matchImages": [EFA_PLUGIN_REGISTRY],
                "defaultCacheDuration": "6h",
                "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
            }
        ],
    }
    assert (
        train[f"{paths.LIB_DIR}/ecr-credential-provider"]
        == (FILES / "ecr_credential_provider.py").read_text()
    )
    script = train[paths.BOOTSTRAP_FILE]
    link = (
        f"ln -sf {paths.LIB_DIR}/ecr-credential-provider "
        f"{paths.CREDENTIAL_PROVIDER_BIN_DIR}/ecr-credential-provider"
    )
    assert link in script
    assert script.index(link) < script.index("install_k3s()")
    assert {
        f"image-credential-provider-config={paths.CREDENTIAL_PROVIDER_CONFIG}",
        f"image-credential-provider-bin-dir={paths.CREDENTIAL_PROVIDER_BIN_DIR}",
    } <= set(node_drop_in(script)["kubelet-arg"])
    # Agents of other pools carry none of it.
    other = agent_files(aws_k3s_efa, "ml-gpu-l4-lt")
    assert paths.CREDENTIAL_PROVIDER_CONFIG not in other
    assert "image-credential-provider" not in other[paths.BOOTSTRAP_FILE]
    pull = aws_k3s_efa.by_name("ml-agent-efa-plugin-pull")
    assert json.loads(pull.inputs["policy"]) == efa_plugin_pull_policy()
    assert pull.urn in aws_k3s_efa.by_name("ml-gpu-train-asg-0").dependencies
    assert not [r for r in aws_k3s.registrations if r.name == "ml-agent-efa-plugin-pull"]


def test_the_pulled_repository_is_the_charts_image():
    """The registry and repository the agents may pull are the ones the pinned chart runs."""
    values = upstream_yaml("aws-efa-k8s-device-plugin/v0.5.30/values.yaml")
    assert values["image"]["repository"] == f"{EFA_PLUGIN_REGISTRY}/{EFA_PLUGIN_REPOSITORY}"
    resource = efa_plugin_pull_policy()["Statement"][1]["Resource"]
    account, region = EFA_PLUGIN_REGISTRY.split(".")[0], EFA_PLUGIN_REGISTRY.split(".")[3]
    assert resource == f"arn:aws:ecr:{region}:{account}:repository/{EFA_PLUGIN_REPOSITORY}"
    assert k3s_agents.efa_image_credentials().match_images == (EFA_PLUGIN_REGISTRY,)
    assert Path(FILES / "aws_api.py").is_file()
