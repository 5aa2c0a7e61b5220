"""paralleljob's contract between the operator, its pods and the training script: the layout, the job file,
the environment, the torchrun command line and the model arithmetic (docs/contract.md).

The bundled trainer, the operator, `paralleljob run` and users' own DeepSpeed scripts all import this
package; it imports only the standard library, so it ships in the operator's distribution and in the
trainer image alike. A script reads its place in the job with

    from paralleljob_contract import Launch, PodEnvironment, load_job_config
    env = PodEnvironment.from_environ(os.environ)
    job = load_job_config(env.config_path)
    coord = job.plan.layout.coord(Launch.from_environ(os.environ).rank)
"""

from paralleljob_contract.environment import Launch, PodEnvironment
from paralleljob_contract.errors import ContractError
from paralleljob_contract.jobfile import JobConfig, Plan, load_job_config, parse_job_config
from paralleljob_contract.launcher import torchrun_command
from paralleljob_contract.layout import AXES, Coord, Layout, tensor_fits

__all__ = [
    "AXES",
    "ContractError",
    "Coord",
    "JobConfig",
    "Launch",
    "Layout",
    "Plan",
    "PodEnvironment",
    "load_job_config",
    "parse_job_config",
    "tensor_fits",
    "torchrun_command",
]
