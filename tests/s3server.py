"""A real S3-compatible server for the store's tests: moto's, on 127.0.0.1 (no cloud, no Docker).

:func:`s3_server` starts one for the test session, in a thread of this process or (``process=True``) as
a process of its own for the deployment test; :func:`new_bucket` makes an empty bucket per test.
Credentials are moto's dummies, set in ``os.environ`` so that worker processes inherit them, as they
would an operator's AWS_* variables.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(endpoint: str) -> bool:
    import urllib.request

    try:
        urllib.request.urlopen(endpoint, timeout=1)
        return True
    except OSError as exc:
        return getattr(exc, "code", None) is not None  # an HTTP error is an answer


@contextmanager
def s3_server(process: bool = False) -> Iterator[str]:
    """The endpoint (``http://127.0.0.1:PORT``) of a moto S3 server, stopped afterwards."""
    os.environ.update(CREDENTIALS)
    if not process:
        from moto.server import ThreadedMotoServer

        server = ThreadedMotoServer(ip_address="127.0.0.1", port=_free_port(), verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        try:
            yield f"http://{host}:{port}"
        finally:
            server.stop()
        return
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not _answers(endpoint):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"moto's S3 server did not start on {endpoint}")
            time.sleep(0.2)
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def new_bucket(endpoint: str) -> str:
    """A new empty bucket's name."""
    import boto3

    name = f"liar-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint, **_client_credentials()).create_bucket(Bucket=name)
    return name


def objects(endpoint: str, bucket: str, prefix: str = "") -> dict[str, int]:
    """Every object under ``prefix`` in the bucket, key → size, as the store's own client lists them."""
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, **_client_credentials())
    out: dict[str, int] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        out.update({o["Key"]: o["Size"] for o in page.get("Contents", [])})
    return out


def _client_credentials() -> dict[str, str]:
    return {
        "aws_access_key_id": CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        "region_name": CREDENTIALS["AWS_DEFAULT_REGION"],
    }
