# servestack Lambda function as a container image: what the zip bundle holds, for a function past Lambda's
# 250 MB unzipped limit (up to 10 GB). Its build context is staged at synth (servestack/cdk/bundling.py):
# requirements.txt (servestack's locked runtime for Lambda and the model packages' requirements), servestack's
# runtime, the project's entry points (handlers/) and the deployment's model packages. The function's handler
# is its image command (ImageConfig.Command), set per function.
FROM public.ecr.aws/lambda/python:3.12

COPY requirements.txt /var/task/
RUN pip install --no-cache-dir --target /var/task -r /var/task/requirements.txt

COPY servestack /var/task/servestack
COPY handlers /var/task/handlers
COPY models /var/task/models
RUN python -m compileall -q /var/task/servestack /var/task/handlers

CMD ["handlers.serverless.handler"]
