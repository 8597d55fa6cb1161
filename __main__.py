"""gpu-k8s: read the stack's cluster spec, build it on its platform, export what users need."""

import pulumi

from components.configbase import stack_cluster_config
from components.outputs import stack_outputs
from components.spec import load_spec
from providers import builder_for

spec = load_spec(stack_cluster_config())
cluster = builder_for(spec)(spec)
for output_name, value in stack_outputs(cluster).items():
    pulumi.export(output_name, value)
