"""The AWS SDK code the handlers need at run time (bundled with them; never imports `servestack`).

- `clients`: the AWS clients (botocore's, no boto3 import) with the retry mode and S3 addressing every handler uses;
- `jobs`: the async job store (S3 payloads and results, SQS messages, DynamoDB job records);
- `sagemaker_jobs`: the same jobs on a SageMaker async endpoint (InvokeEndpointAsync, and the recorder of
  SageMaker's success/error notifications);
- `registry`: the model registry on S3 (or on a directory), read by the multi-model container.
"""
