"""A recording mock engine: runs the real stack program in-process and keeps the resource graph.

Pulumi's `MockMonitor` answers registrations; this subclass also records what the engine would see for
each one (type, name, parent, inputs, dependencies, provider, options such as ignoreChanges) and the
stack outputs. `RealisticMocks` returns outputs shaped like the clouds' (ARNs, endpoints, ASG names),
derived from resource names so every run produces the same plan. The plan tool and the tests share it.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import ipaddress
import json
import logging
import runpy
import sys
import threading
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import rpc
from pulumi.runtime.stack import run_in_stack
from pulumi.runtime.sync_await import _sync_await

from gpu_k8s.components.availability import gcp_offerings
from gpu_k8s.components.configbase import CONFIG_NAMESPACE, raise_if_any
from gpu_k8s.tools import fake_tls
from gpu_k8s.tools.stackfile import config_key_issues, load_stack_file

PROJECT_FILE = "Pulumi.yaml"
ACCOUNT = "123456789012"
STACK_TYPE = "pulumi:pulumi:Stack"
HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
COMPUTE_API = "https://www.googleapis.com/compute/v1"


@dataclass(frozen=True)
class Secret:
    """A value the program marked secret; the plan prints it as [secret]."""

    value: Any


def _unwrap_secrets(value: Any) -> Any:
    if rpc.is_rpc_secret(value):
        return Secret(_unwrap_secrets(rpc.unwrap_rpc_secret(value)))
    if isinstance(value, dict):
        return {k: _unwrap_secrets(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unwrap_secrets(v) for v in value]
    return value


def _reveal(value: Any) -> Any:
    """The plain value behind any secret markers (for the fake providers, which compute with it)."""
    if rpc.is_rpc_secret(value):
        return _reveal(rpc.unwrap_rpc_secret(value))
    if isinstance(value, dict):
        return {k: _reveal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_reveal(v) for v in value]
    return value


@dataclass
class Registration:
    """One resource as the engine would receive it."""

    urn: str
    type: str
    name: str
    parent: str
    custom: bool
    inputs: dict[str, Any]
    dependencies: list[str]
    provider: str
    options: dict[str, Any]
    # The id the mock provider gave it (what other resources receive when they reference it).
    id: str = ""
    # What the mock provider answered, as other resources receive it (addresses, DNS names, ARNs).
    outputs: dict[str, Any] = field(default_factory=dict)

    @property
    def provider_urn(self) -> str:
        """The provider reference without its id (`urn::id` on the wire)."""
        return self.provider.rsplit("::", 1)[0] if self.provider else ""


@dataclass(frozen=True)
class Invoke:
    """A provider function the program called (a data source): its token and arguments."""

    token: str
    args: dict[str, Any]


@dataclass
class Recording:
    """Everything one program run registered."""

    stack: str
    project: str = CONFIG_NAMESPACE
    registrations: list[Registration] = field(default_factory=list)
    # Every provider function called, in order (names the plan sends out, such as SSM parameter paths).
    invokes: list[Invoke] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    # Messages the program logged with pulumi.log.warn (the CLI prints them above the preview).
    warnings: list[str] = field(default_factory=list)

    def by_type(self, type_: str) -> list[Registration]:
        return [r for r in self.registrations if r.type == type_]

    def by_name(self, name: str) -> Registration:
        matches = [r for r in self.registrations if r.name == name]
        if len(matches) != 1:
            raise KeyError(f"{len(matches)} resources named {name!r}")
        return matches[0]

    def region(self, package: str) -> str:
        """The region the stack's provider of `package` (aws, gcp) is configured with ("" without one)."""
        providers = self.by_type(f"pulumi:providers:{package}")
        return str(providers[0].inputs.get("region", "")) if providers else ""

    def instance_template(self, group: Registration) -> Registration | None:
        """The instance template a Compute Engine group's first version names (groups name it by its
        selfLinkUnique: the template's selfLink with "?uniqueId=...")."""
        versions = group.inputs.get("versions") or [{}]
        link = str(versions[0].get("instanceTemplate")).split("?", 1)[0]
        templates = self.by_type("gcp:compute/instanceTemplate:InstanceTemplate")
        return next((t for t in templates if t.outputs.get("selfLink") == link), None)

    def by_urn(self, urn: str) -> Registration:
        return next(r for r in self.registrations if r.urn == urn)


# Providers whose outputs the engine computes for real (keys, certificates, passwords), per type token.
_FAKE_PROVIDERS = {
    "tls:index/privateKey:PrivateKey": fake_tls.private_key_outputs,
    "tls:index/selfSignedCert:SelfSignedCert": fake_tls.self_signed_cert_outputs,
    "tls:index/certRequest:CertRequest": lambda name, inputs: fake_tls.cert_request_outputs(inputs),
    "tls:index/locallySignedCert:LocallySignedCert": fake_tls.locally_signed_cert_outputs,
    "random:index/randomPassword:RandomPassword": fake_tls.random_password_outputs,
    "random:index/randomId:RandomId": fake_tls.random_id_outputs,
}


def _fake_hex(seed: str, length: int) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()[:length]


class RealisticMocks(pulumi_mocks.Mocks):
    """Outputs shaped like the real providers', computed from names so plans are reproducible."""

    def __init__(self, region: str = "us-east-1", project: str = "gpu-k8s-demo"):
        self.region = region
        self.project = project
        # AWS zone IDs start with a short region code (use1 for us-east-1); this one is made from the name.
        parts = region.split("-")
        self.zone_id_prefix = parts[0] + "".join(p[0] for p in parts[1:-1]) + parts[-1]

    def new_resource(self, args: pulumi_mocks.MockResourceArgs) -> tuple[str, dict]:
        outputs = dict(args.inputs)
        name, token = args.name, args.typ
        arn = f"arn:aws:{token.split(':')[1].split('/')[0]}:{self.region}:{ACCOUNT}:{name}"
        id_ = f"{name}-{_fake_hex(name, 8)}"
        if token == "aws:iam/role:Role":
            id_ = outputs["name"] = f"{name}-{_fake_hex(name, 7)}"
            arn = f"arn:aws:iam::{ACCOUNT}:role/{id_}"
        elif token == "aws:iam/instanceProfile:InstanceProfile":
            id_ = outputs["name"] = f"{name}-{_fake_hex(name, 7)}"
            arn = f"arn:aws:iam::{ACCOUNT}:instance-profile/{id_}"
        elif token == "aws:ec2/placementGroup:PlacementGroup":
            # Auto-named as Pulumi names it (the logical name and a random suffix); EC2 names the group so.
            id_ = outputs["name"] = args.inputs.get("name") or f"{name}-{_fake_hex(name, 7)}"
        elif token == "aws:eks/cluster:Cluster":
            id_ = args.inputs["name"]
            outputs["endpoint"] = f"https://{_fake_hex(name, 32).upper()}.gr7.{self.region}.eks.amazonaws.com"
            outputs["certificateAuthority"] = {"data": "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg=="}
            # EKS creates the cluster security group and reports it in vpcConfig.
            outputs["vpcConfig"] = {
                **outputs.get("vpcConfig", {}),
                "clusterSecurityGroupId": f"sg-{_fake_hex(name, 17)}",
            }
        elif token == "aws:eks/nodeGroup:NodeGroup":
            group = args.inputs.get("nodeGroupName") or f"{name}-{_fake_hex(name, 7)}"
            outputs["nodeGroupName"] = group
            outputs["resources"] = [{"autoscalingGroups": [{"name": f"eks-{group}-{_fake_hex(group, 8)}"}]}]
        elif token == "aws:ec2/networkInterface:NetworkInterface":
            id_ = f"eni-{_fake_hex(name, 17)}"
            octets = bytes.fromhex(_fake_hex(name, 4))
            outputs["privateIp"] = f"10.40.{octets[0] % 64}.{octets[1] % 250 + 4}"
        elif token == "aws:lb/loadBalancer:LoadBalancer":
            # Internal balancers' names start with "internal-" (ELB user guide, "Internal load balancers").
            scheme = "internal-" if args.inputs.get("internal") else ""
            outputs["dnsName"] = f"{scheme}{name}-{_fake_hex(name, 16)}.elb.{self.region}.amazonaws.com"
        elif token == "aws:s3/bucket:Bucket":
            # A bucket_prefix gets a 26-character unique suffix (the provider's id.PrefixedUniqueId).
            id_ = outputs["bucket"] = f"{outputs['bucketPrefix']}{_fake_hex(name, 26)}"
            arn = f"arn:aws:s3:::{id_}"
        elif token == "aws:kms/key:Key":
            id_ = str(uuid.UUID(hex=_fake_hex(name, 32)))
            arn = f"arn:aws:kms:{self.region}:{ACCOUNT}:key/{id_}"
        elif token == "aws:secretsmanager/secret:Secret":
            arn = f"arn:aws:secretsmanager:{self.region}:{ACCOUNT}:secret:{name}-{_fake_hex(name, 6)}"
        elif token == "aws:ec2/launchTemplate:LaunchTemplate":
            id_ = f"lt-{_fake_hex(name, 17)}"
            outputs["latestVersion"] = 1
        elif token.startswith("aws:ec2/"):
            prefix = {
                "Vpc": "vpc",
                "Subnet": "subnet",
                "InternetGateway": "igw",
                "NatGateway": "nat",
                "Eip": "eipalloc",
                "RouteTable": "rtb",
            }.get(token.rsplit(":", 1)[1], "res")
            id_ = f"{prefix}-{_fake_hex(name, 17)}"
        elif token == HELM_RELEASE:
            outputs["status"] = {"status": "deployed", "version": args.inputs.get("version")}
        elif token.startswith("kubernetes:") and "metadata" in outputs:
            # Pulumi auto-names objects without metadata.name: the resource name plus a random suffix.
            metadata = dict(outputs["metadata"])
            metadata.setdefault("name", f"{name}-{_fake_hex(name, 8)}")
            outputs["metadata"] = metadata
        if token.startswith("aws:"):
            outputs.setdefault("arn", arn)
        if token.startswith("gcp:"):
            id_ = self._gcp_outputs(token, name, outputs)
        made = _FAKE_PROVIDERS.get(token)
        if made is not None:
            outputs.update(made(name, _reveal(outputs)))
        return id_, outputs

    def _gcp_outputs(self, token: str, name: str, outputs: dict) -> str:
        """GCP resources: auto-names like Pulumi's, ids as the provider writes them; returns the id."""
        project = outputs.get("project") or self.project
        outputs.setdefault("name", f"{name}-{_fake_hex(name, 7)}")
        kind = token.rsplit(":", 1)[1]
        zone = outputs.get("zone")
        if kind == "Account":
            outputs["email"] = f"{outputs['accountId']}@{project}.iam.gserviceaccount.com"
            outputs["member"] = f"serviceAccount:{outputs['email']}"
            outputs["name"] = f"projects/{project}/serviceAccounts/{outputs['email']}"
            return outputs["name"]
        if kind == "Address":
            octets = bytes.fromhex(_fake_hex(name, 6))
            internal = outputs.get("addressType") == "INTERNAL"
            outputs["address"] = (
                f"10.40.{octets[0] % 16}.{octets[1] % 250 + 4}"
                if internal
                else f"34.{octets[0]}.{octets[1]}.{octets[2]}"
            )
            return f"projects/{project}/regions/{outputs['region']}/addresses/{outputs['name']}"
        if token == "gcp:filestore/instance:Instance":
            # Filestore takes the instance's address from its reserved range (the first host address
            # here; which one it takes is Filestore's choice).
            networks = [dict(network) for network in outputs["networks"]]
            first_host = next(ipaddress.IPv4Network(networks[0]["reservedIpRange"]).hosts())
            networks[0]["ipAddresses"] = [str(first_host)]
            outputs["networks"] = networks
            return f"projects/{project}/locations/{outputs['location']}/instances/{outputs['name']}"
        if kind == "HmacKey":
            # A service account's HMAC key: a 61-character access id starting GOOG1E, a 40-character secret.
            outputs["accessId"] = "GOOG1E" + _fake_hex(name, 55).upper()
            outputs["secret"] = base64.b64encode(bytes.fromhex(_fake_hex(name + "-secret", 60))).decode()
            return f"projects/{project}/hmacKeys/{outputs['accessId']}"
        if kind == "Secret":
            outputs["name"] = f"projects/{project}/secrets/{outputs['secretId']}"
            return outputs["name"]
        if kind == "IAMCustomRole":
            outputs["name"] = f"projects/{project}/roles/{outputs['roleId']}"
            return outputs["name"]
        if kind in ("Instance", "InstanceGroup", "InstanceGroupManager") and zone:
            collection = {"Instance": "instances", "InstanceGroup": "instanceGroups"}.get(
                kind, "instanceGroupManagers"
            )
            outputs["selfLink"] = (
                f"{COMPUTE_API}/projects/{project}/zones/{zone}/{collection}/{outputs['name']}"
            )
            if kind == "InstanceGroupManager":
                outputs["instanceGroup"] = (
                    f"{COMPUTE_API}/projects/{project}/zones/{zone}/instanceGroups/{outputs['name']}"
                )
            return f"projects/{project}/zones/{zone}/{collection}/{outputs['name']}"
        if kind == "InstanceTemplate":
            outputs["selfLink"] = (
                f"{COMPUTE_API}/projects/{project}/global/instanceTemplates/{outputs['name']}"
            )
            outputs["selfLinkUnique"] = f"{outputs['selfLink']}?uniqueId={int(_fake_hex(name, 12), 16)}"
            return f"projects/{project}/global/instanceTemplates/{outputs['name']}"
        if kind == "Network":
            return f"projects/{project}/global/networks/{outputs['name']}"
        if kind in ("Subnetwork", "Router"):
            return f"projects/{project}/regions/{outputs['region']}/{kind.lower()}s/{outputs['name']}"
        if kind == "Cluster":
            octets = bytes.fromhex(_fake_hex(name, 6))
            outputs["endpoint"] = "34." + ".".join(str(b) for b in octets[:3])
            outputs["masterAuth"] = {
                **outputs.get("masterAuth", {}),
                "clusterCaCertificate": "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==",
            }
            if "controlPlaneEndpointsConfig" in outputs:
                dns = outputs["controlPlaneEndpointsConfig"].get("dnsEndpointConfig", {})
                dns["endpoint"] = f"gke-{_fake_hex(name, 32)}-{project}.{outputs['location']}.gke.goog"
                outputs["controlPlaneEndpointsConfig"] = {
                    **outputs["controlPlaneEndpointsConfig"],
                    "dnsEndpointConfig": dns,
                }
            return f"projects/{project}/locations/{outputs['location']}/clusters/{outputs['name']}"
        return f"{name}-{_fake_hex(name, 8)}"

    def call(self, args: pulumi_mocks.MockCallArgs) -> tuple[dict, list | None]:
        if args.token == "aws:index/getCallerIdentity:getCallerIdentity":
            return {
                "accountId": ACCOUNT,
                "arn": f"arn:aws:sts::{ACCOUNT}:assumed-role/deployer/ci-session",
                "userId": "AROAEXAMPLE:ci-session",
                "id": ACCOUNT,
            }, []
        if args.token == "aws:iam/getSessionContext:getSessionContext":
            return {
                "arn": args.args["arn"],
                "issuerArn": f"arn:aws:iam::{ACCOUNT}:role/deployer",
                "issuerId": "AROAEXAMPLE",
                "issuerName": "deployer",
                "sessionName": "ci-session",
            }, []
        if args.token == "aws:index/getAvailabilityZones:getAvailabilityZones":
            # Names and IDs map differently in every account: here a maps to az2, b to az3, ...
            zones = [
                (f"{self.region}{c}", f"{self.zone_id_prefix}-az{i + 2}") for i, c in enumerate("abcdef")
            ]
            kept = [z for z in zones if z[1] not in (args.args.get("excludeZoneIds") or [])]
            return {
                "names": [name for name, _ in kept],
                "zoneIds": [zone_id for _, zone_id in kept],
                "id": self.region,
            }, []
        if args.token == "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings":
            # Every zone offers every type here; tests that need scarcity answer this invoke themselves.
            return {
                "locations": [f"{self.zone_id_prefix}-az{i}" for i in range(1, 8)],
                "locationTypes": ["availability-zone-id"] * 7,
                "instanceTypes": [args.args["filters"][0]["values"][0]] * 7,
                "id": self.region,
            }, []
        if args.token == "aws:ec2/getCapacityBlockReservation:getCapacityBlockReservation":
            # Every block here is an active block of two p5.48xlarge in the region's zone c; tests that need
            # another block answer this invoke themselves.
            return {
                "id": args.args["id"],
                "reservationType": "capacity-block",
                "instanceType": "p5.48xlarge",
                "instanceCount": 2,
                "availableInstanceCount": 2,
                "availabilityZone": f"{self.region}c",
                "availabilityZoneId": f"{self.zone_id_prefix}-az4",
                "state": "active",
            }, []
        if args.token == "aws:ec2/getSubnet:getSubnet":
            index = int(_fake_hex(args.args["id"], 2), 16) % 3
            return {
                **args.args,
                "availabilityZone": f"{self.region}{'abc'[index]}",
                "availabilityZoneId": f"{self.zone_id_prefix}-az{index + 1}",
            }, []
        if args.token == "aws:ssm/getParameter:getParameter":
            name = args.args["name"]
            if name.endswith("/release_version"):
                # EKS's form, <minor>.<patch>-<yyyymmdd>; the patch and date here are made up.
                minor = name.split("/")[5]
                value = f"{minor}.{int(_fake_hex(name, 1), 16) % 5}-20261110"
            else:
                value = f"ami-{_fake_hex(name, 17)}"
            return {"name": name, "value": value, "type": "String"}, []
        if args.token == "aws:eks/getAddonVersion:getAddonVersion":
            # Shaped like EKS's answer (vX.Y.Z-eksbuild.N); the numbers are derived, not real releases.
            seed = f"{args.args['addonName']}/{args.args['kubernetesVersion']}"
            minor, patch = (int(_fake_hex(seed, 2), 16) % 40, int(_fake_hex(seed[::-1], 1), 16))
            return {
                **args.args,
                "version": f"v1.{minor}.{patch}-eksbuild.1",
                "id": args.args["addonName"],
            }, []
        if args.token == "aws:eks/getClusters:getClusters":
            # No EKS cluster in the account yet (a first `up`); tests of a running stack answer themselves.
            return {"names": [], "id": self.region}, []
        if args.token == "aws:eks/getCluster:getCluster":
            # An existing Kubernetes 1.35 cluster in a VPC of three private subnets; tests that need another
            # answer this invoke themselves.
            name = args.args["name"]
            return {
                "name": name,
                "id": name,
                "arn": f"arn:aws:eks:{self.region}:{ACCOUNT}:cluster/{name}",
                "version": "1.35",
                "status": "ACTIVE",
                "endpoint": f"https://{_fake_hex(name, 32).upper()}.gr7.{self.region}.eks.amazonaws.com",
                "certificateAuthorities": [{"data": "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg=="}],
                "accessConfigs": [{"authenticationMode": "API_AND_CONFIG_MAP"}],
                "vpcConfig": {
                    "vpcId": f"vpc-{_fake_hex(name, 17)}",
                    "subnetIds": [f"subnet-{_fake_hex(f'{name}/{i}', 17)}" for i in range(3)],
                    "endpointPublicAccess": True,
                    "endpointPrivateAccess": True,
                    "publicAccessCidrs": ["0.0.0.0/0"],
                    "securityGroupIds": [],
                    "clusterSecurityGroupId": f"sg-{_fake_hex(name, 17)}",
                },
            }, []
        if args.token == "gcp:compute/getSubnetwork:getSubnetwork":
            # An existing subnet's primary range; this one is made up.
            return {**args.args, "ipCidrRange": "10.128.0.0/20"}, []
        if args.token == "gcp:compute/getMachineTypes:getMachineTypes":
            # What a project sees where Google offers the type: a GPU machine type where the committed
            # per-zone table lists it, any other type everywhere. Tests that need scarcity answer this
            # invoke themselves.
            name = args.args["filter"].split('"')[1]
            offered = gcp_offerings().offered(name, args.args["zone"]) is not False
            return {**args.args, "machineTypes": [{"name": name}] if offered else [], "id": name}, []
        if args.token == "gcp:organizations/getProject:getProject":
            project = args.args.get("projectId") or self.project
            return {"projectId": project, "number": "123456789012", "name": project, "id": project}, []
        raise NotImplementedError(f"no mock for invoke {args.token}; add one to tools/engine.py")


class DefaultProviderError(Exception):
    """A custom resource fell back to a default provider although the project disables them."""


class _InputCapture(pulumi_mocks.Mocks):
    """Wraps the mocks to keep the inputs the monitor already deserialized, per registering thread."""

    def __init__(self, inner: pulumi_mocks.Mocks):
        self.inner = inner
        self.local = threading.local()

    def new_resource(self, args: pulumi_mocks.MockResourceArgs) -> tuple[str | None, dict]:
        self.local.inputs = args.inputs
        return self.inner.new_resource(args)

    def call(self, args: pulumi_mocks.MockCallArgs) -> tuple[dict, list | None]:
        return self.inner.call(args)


class RecordingMonitor(pulumi_mocks.MockMonitor):
    """A MockMonitor that keeps every registration and the stack outputs."""

    def __init__(self, mocks: pulumi_mocks.Mocks, recording: Recording, denied_packages: frozenset[str]):
        self.capture = _InputCapture(mocks)
        super().__init__(self.capture)
        self.recording = recording
        self.denied_packages = denied_packages
        self.lock = threading.Lock()

    def RegisterResource(self, request):
        is_provider = request.type.startswith("pulumi:providers:")
        package = request.type.split(":", 1)[0]
        denied = "*" in self.denied_packages or package in self.denied_packages
        if request.custom and not is_provider and not request.provider and denied:
            raise DefaultProviderError(
                f"{request.type} {request.name!r} has no explicit provider and default providers are disabled"
            )
        response = super().RegisterResource(request)
        if request.type == STACK_TYPE:
            return response
        options = {
            "ignoreChanges": list(request.ignoreChanges),
            "protect": request.protect,
            "deleteBeforeReplace": request.deleteBeforeReplace,
            "replaceOnChanges": list(request.replaceOnChanges),
            "retainOnDelete": request.retainOnDelete,
            "additionalSecretOutputs": list(request.additionalSecretOutputs),
            "aliases": [str(a) for a in request.aliasURNs],
        }
        registration = Registration(
            urn=response.urn,
            type=request.type,
            name=request.name,
            parent=request.parent,
            custom=request.custom,
            inputs=_unwrap_secrets(self.capture.local.inputs),
            dependencies=sorted(set(request.dependencies)),
            provider=request.provider,
            options={k: v for k, v in options.items() if v},
            id=response.id,
            outputs=_unwrap_secrets(rpc.deserialize_properties(response.object)),
        )
        with self.lock:
            self.recording.registrations.append(registration)
        return response

    def Invoke(self, request):
        response = super().Invoke(request)
        if request.tok != "pulumi:pulumi:getResource":
            invoke = Invoke(request.tok, _unwrap_secrets(rpc.deserialize_properties(request.args)))
            with self.lock:
                self.recording.invokes.append(invoke)
        return response

    def RegisterResourceOutputs(self, request):
        if f"::{STACK_TYPE}::" in request.urn:
            self.recording.outputs = _unwrap_secrets(rpc.deserialize_properties(request.outputs))
        return super().RegisterResourceOutputs(request)


class _WarningCollector(logging.Handler):
    """Keeps the warnings the program logs through the mock engine."""

    def __init__(self, sink: list[str]):
        super().__init__(level=logging.WARNING)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno == logging.WARNING:
            self.sink.append(record.getMessage())


class ProjectNotFound(Exception):
    """No Pulumi.yaml in the directory or any directory above it."""


@dataclass(frozen=True)
class Project:
    """A Pulumi project as the CLI reads it: its name, stack-file directory, program and config defaults."""

    root: Path
    name: str
    stack_dir: Path
    program: Path
    defaults: dict[str, Any]

    def stack_files(self) -> list[Path]:
        return sorted(self.stack_dir.glob("Pulumi.*.yaml"))


def find_project(start: Path | None = None) -> Project:
    """The project whose Pulumi.yaml is in `start` (default: the working directory) or the nearest parent."""
    start = (start or Path.cwd()).resolve()
    for directory in (start, *start.parents):
        if (directory / PROJECT_FILE).is_file():
            return load_project(directory)
    raise ProjectNotFound(
        f"no {PROJECT_FILE} in {start} or above: "
        "run from your Pulumi project, or name a stack file inside one"
    )


def load_project(root: Path) -> Project:
    document = load_stack_file(root / PROJECT_FILE)
    defaults: dict[str, Any] = {}
    for key, declaration in (document.get("config") or {}).items():
        if isinstance(declaration, dict) and "value" in declaration:
            defaults[key] = declaration["value"]
        elif isinstance(declaration, dict) and "default" in declaration:
            defaults[key] = declaration["default"]
    # `main` names the program's directory (or file); the Python host runs its __main__.py.
    program = root / str(document.get("main") or ".")
    return Project(
        root=root,
        name=str(document.get("name") or root.name),
        stack_dir=root / str(document.get("stackConfigDir") or "."),
        program=program / "__main__.py" if program.is_dir() else program,
        defaults=defaults,
    )


def project_of(stack_file: Path) -> Project:
    """The project a stack file belongs to (the nearest Pulumi.yaml above it); for a file kept outside any
    project, the working directory's."""
    try:
        return find_project(stack_file.parent)
    except ProjectNotFound:
        return find_project()


def stack_config(stack_file: Path, project: Project | None = None) -> dict[str, Any]:
    """The project's config defaults overlaid with the stack file's `config:`, as the CLI does."""
    project = project or project_of(stack_file)
    merged = {**project.defaults, **(load_stack_file(stack_file).get("config") or {})}
    raise_if_any(config_key_issues(merged))
    return merged


def _program_runner(project: Project) -> Callable[[], None]:
    def run_main() -> None:
        # As the Python language host does: the program's directory comes first on sys.path.
        if str(project.program.parent) not in sys.path:
            sys.path.insert(0, str(project.program.parent))
        runpy.run_path(str(project.program), run_name="__main__")

    return run_main


def _own_loop(loops: list[asyncio.AbstractEventLoop]) -> None:
    """Executor thread initializer: a loop for this thread, remembered so the run can close it."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    loops.append(loop)


def run_program(
    stack: str,
    config: Mapping[str, Any],
    program: Callable[[], None] | None = None,
    mocks: pulumi_mocks.Mocks | None = None,
    preview: bool = True,
    project: Project | None = None,
) -> Recording:
    """Run the stack program (default: the program of `project`, itself by default the working directory's
    project) under mocks and return what it registered.

    `preview` is what `pulumi preview` runs (a dry run, `pulumi.runtime.is_dry_run()` true); `preview=False`
    is `pulumi up`, where checks that only make sense when resources are really created apply. Exceptions
    from the program (a ConfigError, say) propagate unchanged.
    """
    if program is None:
        project = project or find_project()
        program = _program_runner(project)
    recording = Recording(stack=stack, project=project.name if project else CONFIG_NAMESPACE)
    # Pulumi runs the monitor's calls on the loop's default executor and each of those threads needs an
    # event loop of its own; giving them one here lets this run close every loop it made (left to the
    # garbage collector, a loop can outlive its self-pipe and print "Invalid file descriptor" tracebacks).
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    thread_loops: list[asyncio.AbstractEventLoop] = []
    executor = ThreadPoolExecutor(
        thread_name_prefix="gpu-k8s-engine", initializer=_own_loop, initargs=(thread_loops,)
    )
    loop.set_default_executor(executor)
    region = str(config.get("aws:region") or config.get("gcp:region") or "us-east-1")
    mocks = mocks or RealisticMocks(region=region, project=str(config.get("gcp:project", "gpu-k8s-demo")))
    denied = frozenset(config.get("pulumi:disable-default-providers") or [])
    monitor = RecordingMonitor(mocks, recording, denied_packages=denied)
    logger = logging.getLogger(f"gpu-k8s.engine.{stack}")
    logger.propagate = False
    logger.handlers = [_WarningCollector(recording.warnings)]
    pulumi.runtime.set_mocks(
        mocks,
        project=recording.project,
        stack=stack,
        preview=preview,
        logger=logger,
        monitor=monitor,
    )
    pulumi.runtime.set_all_config(
        {key: value if isinstance(value, str) else json.dumps(value) for key, value in config.items()}
    )
    # set_mocks made a finished root Stack; the CLI runs the program inside a fresh one whose outputs
    # are the exports, so replace it.
    pulumi.runtime.settings.ROOT.set(None)
    try:
        _sync_await(run_in_stack(program))
    finally:
        executor.shutdown(wait=True)
        for each in [*thread_loops, loop]:
            each.close()
        asyncio.set_event_loop(None)
    return recording
