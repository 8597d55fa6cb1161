"""gpu-k8s: read the stack's cluster spec, build it on its platform, export what users need."""

import pulumi

from components.configbase import CONFIG_KEY
from components.outputs import stack_outputs
from components.spec import load_spec
from providers import builder_for

spec = load_spec(pulumi.Config().get_object(CONFIG_KEY.split(":", 1)[1]))
cluster = builder_for(spec)(spec)
for output_name, value in stack_outputs(cluster).items():
    pulumi.export(output_name, value)
