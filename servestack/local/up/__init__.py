"""`servestack local up`: the synthesized templates of serving.yaml's deployments, run on this machine.

serving.yaml -> CDK app -> templates (.servestack/cdk.out, reused while the inputs are unchanged) -> here:
1. the templates are read (servestack/local/stack/topology.py; each service package reads its own resource
   types): every name, environment, IAM policy, queue, route, schedule and SageMaker variant is the template's,
   resolved to local values;
2. an AWS emulator: moto's server in this process behind the IAM engine (servestack/local/iam/access.py), or
   the endpoint of `--endpoint-url` (LocalStack...), which does not enforce IAM;
3. the resources are created as CloudFormation would (servestack/local/stack/provisioning.py);
4. each service package plans its children and its part of the state file (servestack/local/planning/, one
   planner per package, looped over in up/world.py): each Lambda function runs in its own child process (its
   execution environment, with its role's keys); each SageMaker endpoint runs as a child: a router in front of
   one `serve` container per variant;
5. this process is the AWS services around them: the HTTP API fronts (IAM-authenticated), the SQS event
   source mappings, the schedules, and one port where boto3's `sagemaker-runtime` and `lambda` clients work
   unchanged (`--aws-port`, default 8090);
6. a child that dies is restarted with backoff while the others keep running; each child runs in a process
   group of its own, so what it forked dies with it (the state file's `restarts` counts each child's restarts;
   each endpoint's router restarts its variants' containers the same way and counts them in its metrics, on
   the control port the state file records as the deployment's `control_url`).
Children's output is one log stream, each line tagged, and a file per child under `.servestack/logs/`
(servestack/local/logs/log_files.py). Slow steps report progress on stderr (servestack/progress.py). The state file
(`.servestack/local.json`) says where everything is, the stack outputs, and the keys of each role, for other
commands and for replaying a call as a function. Ctrl-C or SIGTERM stops everything.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servestack.local.up.command import run
    from servestack.local.up.options import UpOptions
else:
    from servestack.local import lazy_interface

    __getattr__, __dir__ = lazy_interface(__name__, __file__)

__all__ = ["UpOptions", "run"]
