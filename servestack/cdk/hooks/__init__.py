"""Lambda code deployed inline by the stacks (CodeDeploy hooks); standard library + boto3 only."""
