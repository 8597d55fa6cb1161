"""The GPU catalog: every row sourced, consistent, and known to the clouds' own API models."""

from __future__ import annotations

import fnmatch

import botocore.session
import pytest
import yaml

from gpu_k8s.components.catalog import CATALOG_FILE, load_catalog

SOURCES_FILE = CATALOG_FILE.parent / "gpu-catalog-sources.md"


@pytest.fixture(scope="module")
def raw():
    return yaml.safe_load(CATALOG_FILE.read_text())


def test_every_aws_type_is_in_botocores_ec2_instance_type_enum():
    enum = set(botocore.session.get_session().get_service_model("ec2").shape_for("InstanceType").enum)
    unknown = sorted(set(load_catalog().machine_types["aws"]) - enum)
    assert unknown == []


def test_every_row_names_a_source(raw):
    for section in ("aws_instance_types", "gcp_machine_types"):
        for name, row in raw[section].items():
            assert row.get("source"), f"{section}.{name} has no source"
    for name, row in raw["gpu_models"].items():
        assert row.get("sources"), f"gpu_models.{name} has no sources"


def test_source_ids_are_explained(raw):
    """Every source id of an AWS row or a GPU model is a row of the sources table (ids may be globs)."""
    table_ids = [
        line.split("|")[1].strip()
        for line in SOURCES_FILE.read_text().splitlines()
        if line.startswith("| ") and not line.startswith("| ID")
    ]
    ids = {part.strip() for row in raw["aws_instance_types"].values() for part in row["source"].split(" + ")}
    ids |= {s for row in raw["gpu_models"].values() for s in row["sources"]}
    for source_id in ids:
        assert any(fnmatch.fnmatch(source_id, pattern) for pattern in table_ids), source_id


def test_gpu_types_reference_known_models_and_counts():
    catalog = load_catalog()
    for cloud, types in catalog.machine_types.items():
        for name, machine in types.items():
            assert machine.gpu_model is not None, f"{cloud} {name}"
            assert machine.gpu_count > 0 or machine.gpu_fraction, f"{cloud} {name}"


def test_known_facts_spot_check():
    catalog = load_catalog()
    p5 = catalog.machine_type("aws", "p5.48xlarge")
    assert (p5.gpu_model.id, p5.gpu_count, p5.efa_max_interfaces, p5.arch) == (
        "nvidia-h100-80gb",
        8,
        32,
        "x86_64",
    )
    assert catalog.machine_type("aws", "g5g.xlarge").kubernetes_arch == "arm64"
    h100 = catalog.gpu_models["nvidia-h100-80gb"]
    assert h100.mig_capable and ("1g.10gb", 7) in {(p.name, p.max_instances) for p in h100.mig_profiles}
    assert not catalog.gpu_models["nvidia-l40s"].mig_capable


def test_nearest_gpu_types_always_suggest_something():
    catalog = load_catalog()
    assert catalog.nearest_gpu_types("aws", "g5.xlarg")[0] == "g5.xlarge"
    assert catalog.nearest_gpu_types("aws", "zz9.huge")


def test_every_gpu_model_has_a_memory_size():
    """Slots per node report memory per slot; the catalog must give every model a size."""
    assert [m.id for m in load_catalog().gpu_models.values() if not m.memory_gib] == []
