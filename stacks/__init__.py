"""This project's own CDK composition, around the stacks servestack builds from serving.yaml.

`extend` runs once the deployment stacks exist: add your own stacks to `app`, or resources to a deployment's
stack (each `DeploymentStack` names its deployment, `stack.deployment`, and keeps its alarms, `stack.alarms`).
"""

from __future__ import annotations

from aws_cdk import App

from servestack.cdk.deployment import DeploymentStack


def extend(app: App, serving: list[DeploymentStack]) -> None:
    """This project's additions to the app; none yet. For example, a topic for every deployment's alarms:

    topic = sns.Topic(serving[0], "Alarms")
    for stack in serving:
        for alarm in stack.alarms:
            alarm.add_alarm_action(cw_actions.SnsAction(topic))
    """
