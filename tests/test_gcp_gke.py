"""Graph tests of the gcp-gke stack, and the bad inputs it refuses before any resource exists."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from gpu_k8s.components.catalog import load_catalog
from gpu_k8s.components.configbase import ConfigError
from gpu_k8s.components.spec import load_spec
from gpu_k8s.providers.gcp.gke import system_node_layout
from gpu_k8s.tools.engine import Recording, Registration, Secret, run_program
from tests.conftest import Mutation, assert_refused_before_any_resource, delete_key, set_path

NODE_POOL = "gcp:container/nodePool:NodePool"
ZONES = ["us-central1-a", "us-central1-b", "us-central1-c"]
# name: (machine type, accelerator, GPUs per node, spot, maxNodes, zones) as the example stack file says; the
# accelerator and count of the built-in types are the catalog's, worked out by hand from GCP's machine pages.
GPU_POOLS = {
    "l4": ("g2-standard-8", "nvidia-l4", 1, True, 4, ZONES),
    "a100": ("a2-highgpu-1g", "nvidia-tesla-a100", 1, False, 2, ["us-central1-a", "us-central1-c"]),
    "t4": ("n1-standard-8", "nvidia-tesla-t4", 2, False, 2, ZONES),
    # A compact pool keeps to one zone, the network's first when it names none.
    "h100-train": ("a3-highgpu-8g", "nvidia-h100-80gb", 8, False, 2, ["us-central1-a"]),
}
# GKE's own sharing per pool (the example: L4 time-sliced 4 ways, A100 in 1g.5gb partitions, T4 whole).
GKE_SHARING = {
    "l4": {"gpuSharingConfig": {"gpuSharingStrategy": "TIME_SHARING", "maxSharedClientsPerGpu": 4}},
    "a100": {"gpuPartitionSize": "1g.5gb"},
    "t4": {},
    "h100-train": {},
}


def gpu_node_pools(rec: Recording) -> dict[str, Registration]:
    return {
        r.inputs["nodeConfig"]["labels"]["gpu-k8s.io/pool"]: r
        for r in rec.by_type(NODE_POOL)
        if r.inputs["nodeConfig"]["labels"]["gpu-k8s.io/pool"] != "system"
    }


def test_one_node_pool_per_gpu_pool_with_its_accelerators_scaling_from_zero(gcp_gke):
    pools = gpu_node_pools(gcp_gke)
    assert set(pools) == set(GPU_POOLS)
    for name, (machine, accelerator, count, spot, max_nodes, zones) in GPU_POOLS.items():
        inputs = pools[name].inputs
        config = inputs["nodeConfig"]
        assert config["machineType"] == machine
        assert config["guestAccelerators"] == [
            {
                "type": accelerator,
                "count": count,
                "gpuDriverInstallationConfig": {"gpuDriverVersion": "DEFAULT"},
                **GKE_SHARING[name],
            }
        ]
        assert config.get("spot", False) is spot
        assert inputs["autoscaling"] == {
            "totalMinNodeCount": 0,
            "totalMaxNodeCount": max_nodes,
            "locationPolicy": "ANY" if spot else "BALANCED",
        }
        assert inputs["initialNodeCount"] == 0
        assert inputs["nodeLocations"] == zones
        assert pools[name].options["ignoreChanges"] == ["initialNodeCount", "nodeCount"]
        # No surge node on upgrades: it would need spare GPU quota.
        assert inputs["upgradeSettings"] == {"maxSurge": 0, "maxUnavailable": 1}


def test_gpu_pools_match_the_catalog():
    """The accelerator and count the plan sends are what the catalog says the machine carries."""
    catalog = load_catalog()
    for machine, accelerator, count, *_ in GPU_POOLS.values():
        built_in = catalog.machine_type("gcp", machine)
        if built_in is None:
            attached = catalog.n1_with_gpus(machine, accelerator, count)
            assert attached is not None and attached.gpu_count == count
        else:
            assert (built_in.accelerator, built_in.gpu_count) == (accelerator, count)


def test_gpu_nodes_keep_gkes_device_plugin_and_carry_gkes_own_taint(gcp_gke):
    """GKE's managed driver install is finished by its device plugin's DaemonSet: the opt-out label would
    leave nodes without a driver (NVIDIA AICR gke-gpu-setup.md). Nothing of the operator's sharing either."""
    pools = gpu_node_pools(gcp_gke)
    for name, registration in pools.items():
        labels = registration.inputs["nodeConfig"]["labels"]
        assert labels == {"gpu-k8s.io/pool": name}, "no opt-out, device-plugin-config or MIG-config label"
        # The value GKE sets itself: a second value for the same key and effect is refused by the API.
        sharing = {"l4": "timeSlicing", "a100": "mig"}.get(name)
        assert registration.inputs["nodeConfig"]["taints"] == [
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"},
            *([{"key": "gpu-k8s.io/sharing", "value": sharing, "effect": "NO_SCHEDULE"}] if sharing else []),
        ]


def test_every_node_pool_is_hardened_and_runs_as_the_dedicated_service_account(gcp_gke):
    account = gcp_gke.by_name("ml-nodes-account")
    email = f"{account.inputs['accountId']}@gpu-k8s-demo.iam.gserviceaccount.com"
    pools = gcp_gke.by_type(NODE_POOL)
    assert len(pools) == 1 + len(GPU_POOLS)
    for pool in pools:
        config = pool.inputs["nodeConfig"]
        assert config["serviceAccount"] == email
        assert config["workloadMetadataConfig"] == {"mode": "GKE_METADATA"}
        assert config["shieldedInstanceConfig"] == {
            "enableSecureBoot": True,
            "enableIntegrityMonitoring": True,
        }
        assert config["imageType"] == "COS_CONTAINERD"
        assert pool.inputs["management"] == {"autoRepair": True, "autoUpgrade": True}
        assert account.urn in pool.dependencies


def test_the_apis_the_stack_needs_are_enabled_first_and_stay_enabled(gcp_gke):
    services = {r.inputs["service"]: r for r in gcp_gke.by_type("gcp:projects/service:Service")}
    assert set(services) == {
        "cloudresourcemanager.googleapis.com",
        "compute.googleapis.com",
        "container.googleapis.com",
        "iam.googleapis.com",
        # storage.shared: filestore.
        "file.googleapis.com",
        # The stack's own Secret-encryption key (no gke.secretsKmsKey).
        "cloudkms.googleapis.com",
    }
    assert all(s.inputs["disableOnDestroy"] is False for s in services.values())
    assert services["compute.googleapis.com"].urn in gcp_gke.by_name("ml-network-vpc").dependencies
    assert services["iam.googleapis.com"].urn in gcp_gke.by_name("ml-nodes-account").dependencies
    assert services["container.googleapis.com"].urn in gcp_gke.by_name("ml-gke").dependencies
    # The cluster turns the Filestore CSI add-on on: the Filestore API first (review-gcp.md NG12).
    assert services["file.googleapis.com"].urn in gcp_gke.by_name("ml-gke").dependencies


def test_node_service_account_has_only_the_gke_node_role(gcp_gke):
    bindings = gcp_gke.by_type("gcp:projects/iAMMember:IAMMember")
    assert [(b.inputs["role"], b.inputs["member"]) for b in bindings] == [
        (
            "roles/container.defaultNodeServiceAccount",
            "serviceAccount:ml-nodes@gpu-k8s-demo.iam.gserviceaccount.com",
        )
    ]


def test_system_pool_keeps_exactly_the_configured_nodes(gcp_gke):
    """systemPool.nodes: 2 over three zones: one node in each of two zones (GKE counts per zone)."""
    system = gcp_gke.by_name("ml-system").inputs
    assert system["nodeLocations"] == ["us-central1-a", "us-central1-b"]
    assert system["nodeCount"] == 1
    assert "autoscaling" not in system and "initialNodeCount" not in system
    assert gcp_gke.by_name("ml-system").options.get("ignoreChanges") is None
    assert system["nodeConfig"]["machineType"] == "e2-standard-4"
    assert "guestAccelerators" not in system["nodeConfig"]


def test_cluster_security_and_autoscaling_settings(gcp_gke):
    cluster = gcp_gke.by_name("ml-gke").inputs
    assert cluster["location"] == "us-central1" and cluster["nodeLocations"] == ZONES
    assert cluster["privateClusterConfig"]["enablePrivateNodes"] is True
    assert cluster["masterAuthorizedNetworksConfig"]["cidrBlocks"] == [
        {"cidrBlock": "203.0.113.0/24", "displayName": "apiAccessCidrs-0"}
    ]
    assert cluster["workloadIdentityConfig"] == {"workloadPool": "gpu-k8s-demo.svc.id.goog"}
    assert cluster["enableShieldedNodes"] is True and cluster["enableLegacyAbac"] is False
    assert cluster["masterAuth"]["clientCertificateConfig"] == {"issueClientCertificate": False}
    assert cluster["releaseChannel"] == {"channel": "REGULAR"}
    assert cluster["clusterAutoscaling"] == {"autoscalingProfile": "OPTIMIZE_UTILIZATION"}
    assert cluster["removeDefaultNodePool"] is True
    assert cluster["deletionProtection"] is True
    # GPU nodes are upgraded and repaired in a daily window, not whenever GKE likes.
    assert cluster["maintenancePolicy"] == {"dailyMaintenanceWindow": {"startTime": "03:00"}}
    assert cluster["databaseEncryption"]["state"] == "ENCRYPTED"
    assert set(cluster["loggingConfig"]["enableComponents"]) >= {
        "SYSTEM_COMPONENTS",
        "APISERVER",
        "WORKLOADS",
    }
    # Even the default pool GKE creates and this program removes does not run as the Compute Engine account.
    assert cluster["nodeConfig"]["serviceAccount"].startswith("ml-nodes@")
    assert cluster["addonsConfig"] == {
        "gcePersistentDiskCsiDriverConfig": {"enabled": True},
        # storage.shared: filestore turns it on; buckets as volumes stay off unless gke.gcsFuseCsi.
        "gcpFilestoreCsiDriverConfig": {"enabled": True},
        "gcsFuseCsiDriverConfig": {"enabled": False},
    }


def test_network_is_vpc_native_with_nat_for_private_nodes(gcp_gke):
    subnet = gcp_gke.by_name("ml-network-nodes").inputs
    assert subnet["ipCidrRange"] == "10.40.0.0/20"
    assert subnet["secondaryIpRanges"] == [
        {"rangeName": "pods", "ipCidrRange": "10.64.0.0/14"},
        {"rangeName": "services", "ipCidrRange": "10.68.0.0/20"},
    ]
    assert subnet["privateIpGoogleAccess"] is True
    nat = gcp_gke.by_name("ml-network-nat").inputs
    assert nat["sourceSubnetworkIpRangesToNat"] == "ALL_SUBNETWORKS_ALL_IP_RANGES"
    cluster = gcp_gke.by_name("ml-gke").inputs
    assert cluster["ipAllocationPolicy"] == {
        "clusterSecondaryRangeName": "pods",
        "servicesSecondaryRangeName": "services",
    }
    assert cluster["networkingMode"] == "VPC_NATIVE"


def test_the_second_up_leaves_the_cluster_alone(gcp_gke):
    """The API reports the removed default pool's nodeConfig as empty; nodeConfig is ForceNew, so without
    ignoring it every later `up` would replace the cluster (k8s-config-connector#8125). datapathProvider is
    ForceNew too: a cluster made before Dataplane V2 was the default keeps its own."""
    assert gcp_gke.by_name("ml-gke").options["ignoreChanges"] == ["nodeConfig", "datapathProvider"]


def test_gpu_operator_leaves_gpus_and_mig_to_gke_and_adds_the_rest(gcp_gke):
    values = gcp_gke.by_name("ml-gpu-operator-release").inputs["values"]
    assert values["driver"] == {"enabled": False}
    assert values["devicePlugin"] == {"enabled": False}
    # GKE's device plugin allocates device names: the DCGM exporter maps them to pods by name (NG7).
    assert values["dcgmExporter"]["env"] == [
        {"name": "DCGM_EXPORTER_KUBERNETES_GPU_ID_TYPE", "value": "device-name"}
    ]
    assert values["migManager"] == {"enabled": False}
    assert "mig" not in values
    assert not [r for r in gcp_gke.by_type("kubernetes:core/v1:ConfigMap") if "gpu-operator" in r.name]
    assert values["toolkit"] == {
        "enabled": True,
        "installDir": "/home/kubernetes/bin/nvidia",
        "env": [{"name": "RUNTIME_CONFIG_SOURCE", "value": "file"}],
    }
    assert values["hostPaths"] == {"driverInstallDir": "/home/kubernetes/bin/nvidia"}
    quota = gcp_gke.by_name("ml-gpu-operator-priority-quota")
    # Every pool at its maximum: 4 + 2 + 2 + 2 GPU nodes and 2 system nodes, at most 17 operator pods each
    # (one per operand DaemonSet, the validator, NFD's worker), plus 8 not tied to a node.
    assert quota.inputs["spec"]["hard"] == {"pods": str(17 * (4 + 2 + 2 + 2 + 2) + 8)}
    assert quota.inputs["metadata"]["namespace"] == "gpu-operator"
    assert quota.inputs["spec"]["scopeSelector"]["matchExpressions"][0]["values"] == [
        "system-node-critical",
        "system-cluster-critical",
    ]
    assert quota.urn in gcp_gke.by_name("ml-gpu-operator-release").dependencies


def test_aws_stacks_get_no_priority_quota(aws_eks):
    assert aws_eks.by_type("kubernetes:core/v1:ResourceQuota") == []


def test_gke_keeps_its_own_single_default_storage_class(gcp_gke):
    """GKE's standard-rwo (pd-balanced, WaitForFirstConsumer) is the default; a second would win silently."""
    classes = gcp_gke.by_type("kubernetes:storage.k8s.io/v1:StorageClass")
    assert [c.inputs["metadata"] for c in classes] == [{"name": "shared-rwx"}, {"name": "shared-rwx-retain"}]
    assert gcp_gke.by_name("ml-gke").inputs["addonsConfig"]["gcePersistentDiskCsiDriverConfig"] == {
        "enabled": True
    }


def test_kubeconfig_is_secret_and_uses_the_gke_auth_plugin(gcp_gke):
    provider = gcp_gke.by_name("ml-k8s")
    assert isinstance(provider.inputs["kubeconfig"], Secret)
    kubeconfig = json.loads(provider.inputs["kubeconfig"].value)
    (user,) = kubeconfig["users"]
    assert user["user"]["exec"]["command"] == "gke-gcloud-auth-plugin"
    # The identity the GCP provider deploys with (ADC), also in CI where gcloud is not logged in.
    assert user["user"]["exec"]["args"] == ["--use_application_default_credentials"]
    assert kubeconfig["clusters"][0]["cluster"]["certificate-authority-data"]
    assert "token" not in json.dumps(kubeconfig).lower()
    assert kubeconfig["clusters"][0]["cluster"]["server"].startswith("https://34.")
    assert provider.parent == gcp_gke.by_name("ml").urn
    assert isinstance(gcp_gke.outputs["kubeconfig"], Secret)


def test_every_resource_names_its_provider_and_chains_to_the_stack(gcp_gke):
    urns = {r.urn for r in gcp_gke.registrations}
    for registration in gcp_gke.registrations:
        if registration.custom and not registration.type.startswith("pulumi:providers:"):
            assert registration.provider_urn in urns, registration.name
        assert (
            registration.parent == ""
            or registration.parent in urns
            or registration.parent.endswith("::gpu-k8s-gcp-gke")
        )


def test_stack_outputs_say_who_picks_the_driver(gcp_gke):
    assert gcp_gke.outputs["gpuDriver"] == {
        "owner": "cloud-installer",
        "version": "chosen by GKE's installer (DEFAULT channel)",
    }


def test_slots_in_the_pool_table_are_what_gkes_device_plugin_advertises(gcp_gke):
    """Time-sharing: clients x GPUs; MIG: partitions per GPU x GPUs; all as nvidia.com/gpu, which GKE's
    autoscaler knows from the pool's sharing settings before a node exists."""
    pools = {p["name"]: p for p in gcp_gke.outputs["gpuPools"]}
    assert {name: (p["slotsPerNode"], [s["resource"] for s in p["slots"]]) for name, p in pools.items()} == {
        "l4": (4 * 1, ["nvidia.com/gpu"]),
        "a100": (7 * 1, ["nvidia.com/gpu"]),
        "t4": (2, ["nvidia.com/gpu"]),
        "h100-train": (8, ["nvidia.com/gpu"]),
    }


@pytest.mark.parametrize(
    ("nodes", "zones", "expected"),
    [
        (1, 3, (1, 1)),
        (2, 3, (2, 1)),
        (3, 3, (3, 1)),
        (4, 3, (2, 2)),
        (5, 3, (1, 5)),
        (6, 3, (3, 2)),
        (4, 1, (1, 4)),
    ],
)
def test_system_nodes_split_evenly_over_as_many_zones_as_possible(nodes, zones, expected):
    used, per_zone = system_node_layout(nodes, ZONES[:zones])
    assert (len(used), per_zone) == expected
    assert len(used) * per_zone == nodes and used == ZONES[: len(used)]


def test_system_nodes_in_one_zone_are_warned_about(gcp_gke_config):
    rec = _variant(gcp_gke_config, set_path("systemPool.nodes", 5))
    assert rec.by_name("ml-system").inputs["nodeLocations"] == ["us-central1-a"]
    assert any("systemPool.nodes: 5 nodes do not divide evenly" in w for w in rec.warnings)


def test_driver_requirements_are_warned_once_per_requirement(gcp_gke):
    cuda = [w for w in gcp_gke.warnings if w.startswith("gpu-k8s:cluster.cuda")]
    assert len(cuda) == 1 and 'pools "l4", "a100", "t4", "h100-train"' in cuda[0]
    assert any("MIG on NVIDIA A100" in w for w in gcp_gke.warnings)


def _variant(config: dict[str, Any], *mutations: Mutation) -> Recording:
    changed = copy.deepcopy(config)
    for mutate in mutations:
        mutate(changed["gpu-k8s:cluster"])
    return run_program("variant", changed)


def test_existing_subnet_creates_no_network_resources(gcp_gke_config):
    existing = {
        "networkName": "shared",
        "subnetworkName": "gpu",
        "podsRangeName": "gpu-pods",
        "servicesRangeName": "gpu-services",
        "zones": ZONES,
    }
    rec = _variant(gcp_gke_config, set_path("network", existing))
    assert not [r for r in rec.registrations if r.type.startswith("gcp:compute/")]
    cluster = rec.by_name("ml-gke").inputs
    assert (cluster["network"], cluster["subnetwork"]) == ("shared", "gpu")
    assert cluster["ipAllocationPolicy"] == {
        "clusterSecondaryRangeName": "gpu-pods",
        "servicesSecondaryRangeName": "gpu-services",
    }


def test_zonal_cluster_lives_in_its_first_zone_and_lists_only_the_others(gcp_gke_config):
    rec = _variant(gcp_gke_config, set_path("gke", {"regional": False}))
    cluster = rec.by_name("ml-gke").inputs
    assert cluster["location"] == "us-central1-a"
    assert cluster["nodeLocations"] == ["us-central1-b", "us-central1-c"]
    assert {r.inputs["location"] for r in rec.by_type(NODE_POOL)} == {"us-central1-a"}


def test_kms_key_encrypts_secrets_and_gke_may_use_it_first(gcp_gke_config):
    key = "projects/gpu-k8s-demo/locations/us-central1/keyRings/gke/cryptoKeys/secrets"
    rec = _variant(gcp_gke_config, set_path("gke", {"secretsKmsKey": key, "filestoreCsi": True}))
    cluster = rec.by_name("ml-gke")
    assert cluster.inputs["databaseEncryption"] == {"state": "ENCRYPTED", "keyName": key}
    assert cluster.inputs["addonsConfig"]["gcpFilestoreCsiDriverConfig"] == {"enabled": True}
    access = rec.by_name("ml-secrets-key-access")
    assert access.inputs == {
        "cryptoKeyId": key,
        "role": "roles/cloudkms.cryptoKeyEncrypterDecrypter",
        "member": "serviceAccount:service-123456789012@container-engine-robot.iam.gserviceaccount.com",
    }
    assert access.urn in cluster.dependencies
    # The binding names GKE's service agent, which enabling the GKE API creates.
    assert rec.by_name("ml-container-api").urn in access.dependencies
    assert rec.by_name("ml-file-api").inputs["service"] == "file.googleapis.com"
    # The user's key: no key of the stack's own, no KMS API to enable.
    assert not rec.by_type("gcp:kms/keyRing:KeyRing") and not rec.by_type("gcp:kms/cryptoKey:CryptoKey")
    assert "cloudkms.googleapis.com" not in {
        r.inputs["service"] for r in rec.by_type("gcp:projects/service:Service")
    }


def test_without_a_key_of_the_users_the_stack_encrypts_secrets_with_its_own(gcp_gke):
    """security.md S11 / CIS GKE 5.3.1: Secrets are encrypted with a Cloud KMS key by default: a key ring in
    the cluster's region (KMS has no zonal locations), a key rotated every 90 days, GKE's service agent
    allowed to use that key only, all before the cluster."""
    ring = gcp_gke.by_name("ml-secrets")
    assert ring.type == "gcp:kms/keyRing:KeyRing"
    # Auto-named (no name input): KMS never deletes a ring or key, so a fixed name would collide when the
    # stack is made again.
    assert ring.inputs == {"project": "gpu-k8s-demo", "location": "us-central1"}
    assert gcp_gke.by_name("ml-cloudkms-api").urn in ring.dependencies
    key = gcp_gke.by_name("ml-secrets-key")
    assert key.inputs == {"keyRing": ring.id, "rotationPeriod": "7776000s"}
    access = gcp_gke.by_name("ml-secrets-key-access")
    assert access.inputs == {
        "cryptoKeyId": key.id,
        "role": "roles/cloudkms.cryptoKeyEncrypterDecrypter",
        "member": "serviceAccount:service-123456789012@container-engine-robot.iam.gserviceaccount.com",
    }
    cluster = gcp_gke.by_name("ml-gke")
    assert cluster.inputs["databaseEncryption"] == {"state": "ENCRYPTED", "keyName": key.id}
    assert access.urn in cluster.dependencies


def test_new_clusters_enforce_network_policy_and_running_ones_are_not_replaced_for_it(gcp_gke):
    """security.md S11: NetworkPolicy is enforced only by Dataplane V2 (or Calico); the dataplane cannot
    change without replacing the cluster in the provider, so a running cluster keeps its own."""
    cluster = gcp_gke.by_name("ml-gke")
    assert cluster.inputs["datapathProvider"] == "ADVANCED_DATAPATH"
    assert "datapathProvider" in cluster.options["ignoreChanges"]
    # Dataplane V2 enforces policies itself: the Calico add-on and `networkPolicy` must stay unset.
    assert "networkPolicy" not in cluster.inputs
    assert "networkPolicyConfig" not in cluster.inputs["addonsConfig"]


def test_latest_driver_channel_and_hyperdisk_for_series_without_pd(gcp_gke_config):
    # us-central1 offers A3 Ultra in zone b only (SkyPilot's catalog).
    h200 = {"name": "h200", "instanceType": "a3-ultragpu-8g", "maxNodes": 1, "zones": ["us-central1-b"]}
    rec = _variant(
        gcp_gke_config,
        set_path("gke", {"gpuDriverVersion": "latest"}),
        set_path("gpuPools", [h200]),
    )
    config = gpu_node_pools(rec)["h200"].inputs["nodeConfig"]
    assert config["guestAccelerators"][0]["gpuDriverInstallationConfig"] == {"gpuDriverVersion": "LATEST"}
    assert config["guestAccelerators"][0]["count"] == 8
    assert config["diskType"] == "hyperdisk-balanced"
    assert rec.by_name("ml-system").inputs["nodeConfig"]["diskType"] == "pd-balanced"


def test_a_valid_n1_attachment_resolves_to_the_catalog_gpu(gcp_gke_config):
    spec = load_spec(gcp_gke_config["gpu-k8s:cluster"])
    (t4,) = [pool for pool in spec.gpu_pools if pool.name == "t4"]
    machine = spec.pool_machine(t4, load_catalog())
    assert machine is not None and machine.gpu_model is not None
    # n1-standard-8: 8 vCPUs at 3.75 GB each, two attached T4s.
    assert (machine.gpu_model.id, machine.gpu_count, machine.vcpu, machine.memory_gib) == (
        "nvidia-t4",
        2,
        8,
        30.0,
    )


# (id, mutation, YAML path named in the error, words the message must contain)
BAD_GKE_INPUTS: list[tuple[str, Mutation, str, tuple[str, ...]]] = [
    *(
        (
            f"kms-key-{index}",
            set_path("gke", {"secretsKmsKey": key}),
            "gke.secretsKmsKey",
            ("not a Cloud KMS key name",),
        )
        for index, key in enumerate(
            (
                'projects/my-project/locations/us-central1/keyRings/r/cryptoKeys/k"; rm -rf /',
                "projects/my-project/locations/us-central1/keyRings/r/cryptoKeys/k/cryptoKeyVersions/1",
                "projects/My Project/locations/us-central1/keyRings/r/cryptoKeys/k",
                "projects/my-project/locations/us-central1/keyRings/" + "r" * 64 + "/cryptoKeys/k",
            )
        )
    ),
    # Ranges no host can have addresses in, the documentation ranges included (Python calls them private).
    ("gcp-cidr-documentation", set_path("network.cidr", "203.0.113.0/24"), "network.cidr", ("RFC 5737",)),
    ("gcp-cidr-this-network", set_path("network.cidr", "0.0.0.0/16"), "network.cidr", ("hosts can have",)),
    (
        "master-range-documentation",
        set_path("gke", {"masterIpv4CidrBlock": "192.0.2.16/28"}),
        "gke.masterIpv4CidrBlock",
        ("no documentation range",),
    ),
    (
        "control-plane-range-inside-the-node-range",
        set_path("gke", {"masterIpv4CidrBlock": "10.40.0.16/28"}),
        "gke.masterIpv4CidrBlock",
        ("overlaps network.cidr (10.40.0.0/20)",),
    ),
    (
        "cluster-name-leaves-no-room-for-pool-names",
        set_path("name", "a" * 32),
        "gpuPools[0].name",
        ("shorten the cluster name", "at most 27 characters"),
    ),
    (
        "zone-listed-twice",
        set_path("network.zones", ["us-central1-a", "us-central1-a"]),
        "network.zones[1]",
        ("listed twice",),
    ),
    (
        "pod-range-not-private",
        set_path("network.podsCidr", "8.8.0.0/14"),
        "network.podsCidr",
        ("not a private range", "RFC 1918"),
    ),
    (
        "kms-key-not-a-key-name",
        set_path("gke", {"secretsKmsKey": "my-key"}),
        "gke.secretsKmsKey",
        ("not a Cloud KMS key name",),
    ),
    (
        "node-labels-too-large-for-one-gke-request",
        set_path("gpuPools.0.labels", {f"team-{i}": "x" * 60 for i in range(20)}),
        "gpuPools[0].labels",
        ("GKE takes at most 1024",),
    ),
    (
        "gpu-count-not-the-machine-types",
        set_path("gpuPools.1.accelerator", {"type": "nvidia-tesla-a100", "count": 2}),
        "gpuPools[1].accelerator.count",
        ("a2-highgpu-1g carries 1 x nvidia-tesla-a100", "count: 1"),
    ),
    (
        "accelerator-not-on-this-machine",
        set_path("gpuPools.0.accelerator", {"type": "nvidia-tesla-t4", "count": 1}),
        "gpuPools[0].accelerator.type",
        ("not attachable to g2-standard-8", "n1 machine type"),
    ),
    (
        "accelerator-not-attachable-to-n1",
        set_path("gpuPools.2.accelerator", {"type": "nvidia-l4", "count": 1}),
        "gpuPools[2].accelerator",
        ("nvidia-l4 does not attach to N1", "g2-standard-"),
    ),
    (
        "n1-count-not-allowed",
        set_path("gpuPools.2.accelerator.count", 3),
        "gpuPools[2].accelerator",
        ("attaches 1 / 2 / 4 at a time, not 3",),
    ),
    (
        "n1-too-big-for-its-gpus",
        set_path(
            "gpuPools.2",
            {
                "name": "v100",
                "instanceType": "n1-standard-32",
                "maxNodes": 1,
                "accelerator": {"type": "nvidia-tesla-v100", "count": 1},
            },
        ),
        "gpuPools[2].accelerator",
        ("allows at most 12 vCPUs; n1-standard-32 has 32",),
    ),
    (
        "n1-without-gpus",
        delete_key("gpuPools.2.accelerator"),
        "gpuPools[2].accelerator",
        ("n1-standard-8 has no GPU of its own", "nvidia-tesla-t4"),
    ),
    (
        "mig-profile-of-another-gpu",
        set_path("gpuPools.1.sharing", {"mode": "mig", "profile": "1g.18gb"}),
        "gpuPools[1].sharing.profile",
        ("1g.18gb", "1g.5gb"),
    ),
    (
        "mig-on-a-gpu-without-mig",
        set_path("gpuPools.0.sharing", {"mode": "mig", "profile": "1g.6gb"}),
        "gpuPools[0].sharing.mode",
        ("L4",),
    ),
    (
        "zones-missing",
        delete_key("network.zones"),
        "network.zones",
        ("zones their nodes run in", "us-central1-a"),
    ),
    (
        "zone-of-another-region",
        set_path("network.zones", ["us-central1-a", "europe-west4-a"]),
        "network.zones[1]",
        ("not in gcp:region us-central1",),
    ),
    (
        "pool-zone-malformed",
        set_path("gpuPools.1.zones", ["us-central1"]),
        "gpuPools[1].zones[0]",
        ("not a GCP zone name",),
    ),
    (
        "aws-network-key",
        set_path("network.vpcId", "vpc-0abc"),
        "network.vpcId",
        ("not a network setting on gcp", "podsCidr"),
    ),
    (
        "subnet-ranges-overlap",
        set_path("network.podsCidr", "10.40.0.0/14"),
        "network.podsCidr",
        ("overlaps network.cidr",),
    ),
    (
        "new-and-existing-subnet",
        set_path("network.subnetworkName", "gpu"),
        "gpu-k8s:cluster.network",
        ("exclude each other",),
    ),
    (
        "services-range-missing",
        delete_key("network.servicesCidr"),
        "network.servicesCidr",
        ("is missing", "10.68.0.0/20"),
    ),
    (
        "system-pool-is-a-gpu-type",
        set_path("systemPool.instanceType", "g2-standard-4"),
        "systemPool.instanceType",
        ("not a CPU machine type", "e2-standard-4"),
    ),
    (
        "master-range-not-a-28",
        set_path("gke", {"masterIpv4CidrBlock": "172.16.0.0/24"}),
        "gke.masterIpv4CidrBlock",
        ("private /28",),
    ),
    (
        "kms-key-in-another-region",
        set_path(
            "gke", {"secretsKmsKey": "projects/my-project/locations/europe-west4/keyRings/r/cryptoKeys/k"}
        ),
        "gke.secretsKmsKey",
        ("europe-west4", "us-central1"),
    ),
    (
        "renamed-shared-resource",
        set_path("gpuPools.0.sharing", {"mode": "timeSlicing", "replicas": 4, "renameByDefault": True}),
        "gpuPools[0].sharing.renameByDefault",
        ("not available on gke", "always advertises shared GPUs as nvidia.com/gpu"),
    ),
    (
        "fail-requests-greater-than-one",
        set_path("gpuPools.0.sharing", {"mode": "mps", "replicas": 2, "failRequestsGreaterThanOne": True}),
        "gpuPools[0].sharing.failRequestsGreaterThanOne",
        ("not available on gke",),
    ),
    (
        "mig-layout-of-several-sizes",
        set_path("gpuPools.1.sharing", {"mode": "mig", "layout": {"1g.5gb": 3, "2g.10gb": 2}}),
        "gpuPools[1].sharing.layout",
        ("partitions of one size", "kind: k3s"),
    ),
    (
        "mig-mixed-strategy",
        set_path("gpuPools.1.sharing", {"mode": "mig", "profile": "1g.5gb", "strategy": "mixed"}),
        "gpuPools[1].sharing.strategy",
        ("single strategy",),
    ),
    (
        "maintenance-window-not-a-time",
        set_path("gke", {"maintenanceWindowStart": "3am"}),
        "gke.maintenanceWindowStart",
        ("HH:MM",),
    ),
    (
        "maintenance-exclusion-not-a-timestamp",
        set_path(
            "gke",
            {
                "maintenanceExclusions": [
                    {"name": "freeze", "startTime": "2027-01-04", "endTime": "2027-02-01T00:00:00Z"}
                ]
            },
        ),
        "gke.maintenanceExclusions[0].startTime",
        ("RFC 3339",),
    ),
    (
        "maintenance-exclusion-ends-first",
        set_path(
            "gke",
            {
                "maintenanceExclusions": [
                    {"name": "freeze", "startTime": "2027-02-01T00:00:00Z", "endTime": "2027-01-04T00:00:00Z"}
                ]
            },
        ),
        "gke.maintenanceExclusions[0].endTime",
        ("ends before it starts",),
    ),
    *(
        (
            f"maintenance-exclusion-iso-not-rfc3339-{index}",
            set_path(
                "gke",
                {
                    "maintenanceExclusions": [
                        {"name": "freeze", "startTime": text, "endTime": "2027-02-01T00:00:00Z"}
                    ]
                },
            ),
            "gke.maintenanceExclusions[0].startTime",
            ("RFC 3339",),
        )
        # ISO 8601 forms Python reads and the GKE API does not: a space for T, no seconds, the basic format.
        for index, text in enumerate(("2027-01-04 00:00:00+00:00", "2027-01-04T00:00Z", "20270104T000000Z"))
    ),
    (
        "maintenance-exclusion-without-a-name",
        set_path(
            "gke",
            {
                "maintenanceExclusions": [
                    {"name": "", "startTime": "2027-01-04T00:00:00Z", "endTime": "2027-02-01T00:00:00Z"}
                ]
            },
        ),
        "gke.maintenanceExclusions[0].name",
        ("is empty",),
    ),
    (
        "maintenance-exclusions-with-one-name",
        set_path(
            "gke",
            {
                "maintenanceExclusions": [
                    {
                        "name": "freeze",
                        "startTime": "2027-01-04T00:00:00Z",
                        "endTime": "2027-02-01T00:00:00Z",
                    },
                    {
                        "name": "freeze",
                        "startTime": "2027-06-01T00:00:00Z",
                        "endTime": "2027-06-08T00:00:00Z",
                    },
                ]
            },
        ),
        "gke.maintenanceExclusions[1].name",
        ("is the name of maintenanceExclusions[0]",),
    ),
    (
        "per-pool-scale-down-time",
        set_path("gpuPools.0.scaleDownUnneededTime", "10m"),
        "gpuPools[0].scaleDownUnneededTime",
        ("no per-pool scale-down time", "remove it"),
    ),
    (
        "node-pool-name-too-long",
        set_path("gpuPools.0.name", "l4-" + "x" * 25),
        "gpuPools[0].name",
        ("longer than 40 characters", "at most"),
    ),
    (
        "driver-version-for-gkes-installer",
        set_path("addonVersions", {"nvidiaDriver": "580.126.20"}),
        "addonVersions.nvidiaDriver",
        ("GKE's installer", "remove"),
    ),
    (
        "gke-settings-unknown-key",
        set_path("gke", {"autopilot": True}),
        "gke.autopilot",
        ("unknown key", "releaseChannel"),
    ),
]


@pytest.mark.parametrize(
    ("mutation", "path", "words"),
    [case[1:] for case in BAD_GKE_INPUTS],
    ids=[case[0] for case in BAD_GKE_INPUTS],
)
def test_bad_gke_input_is_refused_before_any_resource(gcp_gke_config, mutation, path, words):
    assert_refused_before_any_resource(gcp_gke_config, mutation, path, words)


def _up(config: dict[str, Any], *mutations: Mutation) -> Recording:
    changed = copy.deepcopy(config)
    for mutate in mutations:
        mutate(changed["gpu-k8s:cluster"])
    return run_program("up", changed, preview=False)


def test_documentation_cidrs_are_refused_on_up_and_warned_about_in_a_preview(gcp_gke, gcp_gke_config):
    assert any('apiAccessCidrs[0]: "203.0.113.0/24" - is an RFC 5737' in w for w in gcp_gke.warnings)
    with pytest.raises(ConfigError) as caught:
        _up(gcp_gke_config)
    (issue,) = caught.value.issues
    assert issue.path == "gpu-k8s:cluster.apiAccessCidrs[0]" and "pulumi up" in issue.fix
    # A real range deploys.
    assert _up(gcp_gke_config, set_path("apiAccessCidrs", ["198.18.7.0/24"])).by_name("ml-gke")


def test_dns_endpoint_reaches_the_api_through_iam_whatever_the_cidrs(gcp_gke_config):
    rec = _up(gcp_gke_config, set_path("gke", {"controlPlaneDnsEndpoint": True}))
    cluster = rec.by_name("ml-gke").inputs
    assert cluster["controlPlaneEndpointsConfig"]["dnsEndpointConfig"]["allowExternalTraffic"] is True
    kubeconfig = json.loads(rec.by_name("ml-k8s").inputs["kubeconfig"].value)
    server = kubeconfig["clusters"][0]["cluster"]
    assert server["server"].startswith("https://gke-") and server["server"].endswith(".gke.goog")
    assert "certificate-authority-data" not in server


def test_maintenance_exclusions_reach_the_cluster(gcp_gke_config):
    freeze = {"name": "freeze", "startTime": "2027-01-04T00:00:00Z", "endTime": "2027-02-01T00:00:00Z"}
    rec = _variant(
        gcp_gke_config,
        set_path("gke", {"maintenanceWindowStart": "22:30", "maintenanceExclusions": [freeze]}),
    )
    assert rec.by_name("ml-gke").inputs["maintenancePolicy"] == {
        "dailyMaintenanceWindow": {"startTime": "22:30"},
        "maintenanceExclusions": [
            {
                "exclusionName": "freeze",
                "startTime": "2027-01-04T00:00:00Z",
                "endTime": "2027-02-01T00:00:00Z",
                "exclusionOptions": {"scope": "NO_MINOR_UPGRADES"},
            }
        ],
    }


def test_mps_pools_share_with_gkes_mps(gcp_gke_config):
    rec = _variant(gcp_gke_config, set_path("gpuPools.0.sharing", {"mode": "mps", "replicas": 3}))
    (accelerator,) = gpu_node_pools(rec)["l4"].inputs["nodeConfig"]["guestAccelerators"]
    assert accelerator["gpuSharingConfig"] == {"gpuSharingStrategy": "MPS", "maxSharedClientsPerGpu": 3}


@pytest.mark.parametrize("key", ["gcp:project", "gcp:region"])
def test_missing_gcp_settings_are_refused(gcp_gke_config, key):
    config = copy.deepcopy(gcp_gke_config)
    del config[key]
    assert_refused_before_any_resource(config, lambda cluster: None, key, ("pulumi config set",))


def test_gke_section_on_another_platform_is_refused(aws_eks_config):
    assert_refused_before_any_resource(
        aws_eks_config, set_path("gke", {"regional": False}), "gpu-k8s:cluster.gke", ("only", "gke")
    )


def test_accelerator_on_aws_is_refused(aws_eks_config):
    assert_refused_before_any_resource(
        aws_eks_config,
        set_path("gpuPools.0.accelerator", {"type": "nvidia-l40s", "count": 1}),
        "gpuPools[0].accelerator",
        ("aws instance types carry their GPUs",),
    )


def test_gcp_keys_on_aws_are_refused(aws_eks_config):
    assert_refused_before_any_resource(
        aws_eks_config,
        set_path("network.zones", ["us-east-1a"]),
        "network.zones",
        ("not a network setting on aws",),
    )


@pytest.mark.parametrize(
    ("pool", "zones", "words"),
    [
        # h100-train has an interconnect: one placement group, one zone.
        (4, ["use1-az4", "use1-az5"], "keep one zone, e.g. zones: [use1-az4]"),
        (0, ["us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "us-east-1e"], "raise maxNodes to 5"),
    ],
)
def test_aws_pool_zones_that_cannot_hold_the_pool_are_refused(aws_eks_config, pool, zones, words):
    """On AWS `zones` places a pool for good (tests/test_zone_placement.py); a placement its nodes cannot
    have is refused before any resource."""
    assert_refused_before_any_resource(
        aws_eks_config, set_path(f"gpuPools.{pool}.zones", zones), f"gpuPools[{pool}].zones", (words,)
    )


def test_a_capacity_block_pool_takes_no_zones(aws_eks_config):
    block = {
        "name": "blk",
        "instanceType": "p5.48xlarge",
        "maxNodes": 2,
        "capacityReservationId": "cr-02168da1478b509e0",
    }

    def add(cluster: dict[str, Any]) -> None:
        cluster["gpuPools"].append({**block, "zones": ["use1-az4"]})

    assert_refused_before_any_resource(
        aws_eks_config, add, "gpuPools[5].zones", ("a Capacity Block has its own zone",)
    )


def test_the_newest_supported_minor_warns_that_the_channel_would_leave_support(gcp_gke_config):
    """review-gcp.md NG11: the release channel upgrades the cluster's minor on its own; from the newest
    minor the GPU Operator supports, that is an unsupported one, unless an exclusion freezes the minor."""
    config = copy.deepcopy(gcp_gke_config)
    config["gpu-k8s:cluster"]["kubernetesVersion"] = "1.36"
    warned = [
        w for w in run_program("newest", config).warnings if w.startswith("gpu-k8s:cluster.kubernetesVersion")
    ]
    assert len(warned) == 1 and "REGULAR channel upgrades the cluster" in warned[0]
    assert "scope NO_MINOR_UPGRADES" in warned[0]
    config["gpu-k8s:cluster"]["gke"]["maintenanceExclusions"] = [
        {
            "name": "hold-minor",
            "startTime": "2027-01-04T00:00:00Z",
            "endTime": "2027-06-30T00:00:00Z",
            "scope": "NO_MINOR_UPGRADES",
        }
    ]
    frozen = run_program("frozen", config).warnings
    assert not [w for w in frozen if w.startswith("gpu-k8s:cluster.kubernetesVersion")]
    # One minor below the newest: the channel's next minor is still supported.
    assert not [w for w in run_program("older", gcp_gke_config).warnings if "kubernetesVersion" in w]


def test_the_private_control_plane_reaches_the_add_ons_webhooks_and_kedas_api(gcp_gke, gcp_gke_config):
    """GKE lets a private cluster's control plane reach nodes on 443 and 10250 only; Kueue's and JobSet's
    webhooks listen on 9443, KEDA's metrics API on 6443 and its webhooks on 9443 (their charts)."""
    assert not [r for r in gcp_gke.by_type("gcp:compute/firewall:Firewall") if "control-plane" in r.name]
    for extra, ports in (
        ({"batch": {"namespaces": ["research"]}}, ["9443"]),
        ({"inference": {}}, ["6443", "9443"]),
    ):
        config = copy.deepcopy(gcp_gke_config)
        config["gpu-k8s:cluster"].update(extra)
        recording = run_program("gcp-gke", config)
        rule = recording.by_name("ml-control-plane-to-add-ons")
        assert rule.inputs["allows"] == [{"protocol": "tcp", "ports": ports}]
        # The stack's control-plane range (gke.masterIpv4CidrBlock's default).
        assert rule.inputs["sourceRanges"] == ["172.16.0.0/28"]
        nodes = recording.by_name("ml-nodes-account")
        assert rule.inputs["targetServiceAccounts"] == [
            f"{nodes.inputs['accountId']}@gpu-k8s-demo.iam.gserviceaccount.com"
        ]
