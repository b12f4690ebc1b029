"""This project's CDK app: one stack per deployment in serving.yaml, plus the CI/CD pipeline on request.

    make synth                                   # every deployment, offline
    cdk deploy servestack-digits-api             # one deployment
    cdk synth -c servestack:deployments=digits-api,cancer-async
    cdk synth -c servestack:pipeline=true -c servestack:repo=owner/name -c servestack:connection-arn=arn:...

serving.yaml is validated before anything is synthesized: a bad value stops here with its path, the value and
what is allowed. cdk-nag's AwsSolutions checks run on every synth. Add your own resources in `stacks/`.
"""

from pathlib import Path

from servestack.cdk.app import main
from stacks import extend

if __name__ == "__main__":
    main(Path(__file__).resolve().parent, extend=extend)
