#!/bin/sh
# An S3 server for a Compose deployment (moto: objects live in its memory), with the
# bucket the nodes use made once it answers.
set -e
moto_server -H 0.0.0.0 -p 9000 &
python3 - <<'PY'
import os, time, boto3
s3 = boto3.client("s3", endpoint_url="http://127.0.0.1:9000", region_name="us-east-1",
                  aws_access_key_id=os.environ["AENV_STORAGE_S3_ACCESS_KEY"],
                  aws_secret_access_key=os.environ["AENV_STORAGE_S3_SECRET_KEY"])
for _ in range(100):
    try:
        s3.create_bucket(Bucket=os.environ["AENV_STORAGE_S3_BUCKET"])
        break
    except Exception:
        time.sleep(0.2)
PY
wait
