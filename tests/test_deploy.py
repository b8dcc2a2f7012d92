"""The compose file and the Dockerfile, read as data (no Docker engine needed): every service has a
healthcheck and waits for healthy servers, the app and workers run as a user other than root, one
worker per GPU, Flower is there, and no password is written into the file."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
LIAR_SERVICES = [name for name, s in SERVICES.items() if "build" in s]


def test_every_service_has_a_healthcheck_and_a_restart_policy():
    for name, service in SERVICES.items():
        assert service.get("healthcheck", {}).get("test"), name
        assert service.get("restart") in ("unless-stopped", "always", "on-failure"), name


def test_services_wait_for_healthy_servers():
    for name in ("app", "worker-gpu0", "worker-gpu1"):
        needs = SERVICES[name]["depends_on"]
        assert needs["redis"]["condition"] == needs["postgres"]["condition"] == "service_healthy", name
        assert needs["migrate"]["condition"] == "service_completed_successfully", name
    assert SERVICES["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert SERVICES["flower"]["depends_on"]["redis"]["condition"] == "service_healthy"


def test_one_worker_per_gpu_with_a_grace_period():
    for index in ("0", "1"):
        worker = SERVICES[f"worker-gpu{index}"]
        (device,) = worker["deploy"]["resources"]["reservations"]["devices"]
        assert device["device_ids"] == [index] and "gpu" in device["capabilities"]
        assert worker["command"][:2] == ["liar", "worker"]
        assert re.fullmatch(r"\d+m", worker["stop_grace_period"])


def test_the_liar_services_run_the_image_as_a_non_root_user():
    dockerfile = (ROOT / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\S+)", dockerfile, re.M)
    assert users and users[-1] not in ("root", "0")
    for name in LIAR_SERVICES:
        assert SERVICES[name].get("user") in (None, users[-1]), name  # no override back to root
    assert {"app", "worker-gpu0", "worker-gpu1", "flower"} <= set(LIAR_SERVICES)


def test_flower_is_served():
    assert "flower" in SERVICES["flower"]["command"]


def test_no_password_is_written_into_the_compose_file():
    text = (ROOT / "docker-compose.yml").read_text()
    assert not re.search(r"://[^/\s:@]*:[^@\s$]+@", text), "a URL with a password"
    for name, service in SERVICES.items():
        env = service.get("environment") or {}
        assert not [k for k in env if re.search("PASSWORD|SECRET|AUTH", k)], name
        assert service.get("env_file") == ".env" or name not in LIAR_SERVICES + ["postgres", "redis"], name
    example = (ROOT / "deploy.env.example").read_text()
    for key in ("POSTGRES_PASSWORD", "REDIS_PASSWORD", "LIAR_DATABASE_URL", "LIAR_BROKER_URL"):
        assert re.search(rf"^{key}=", example, re.M), key


# --- several machines (docs/deploy-cluster.md): deploy/web.yml and deploy/gpu-host.yml ----------------------

WEB = yaml.safe_load((ROOT / "deploy" / "web.yml").read_text())["services"]
GPU_HOST = yaml.safe_load((ROOT / "deploy" / "gpu-host.yml").read_text())


def test_gpu_hosts_share_no_disk_one_worker_per_card():
    workers = GPU_HOST["services"]
    volumes = [w["volumes"] for w in workers.values()]
    assert len({v[0].split(":")[0] for v in volumes}) == len(workers)  # a data volume of its own each
    assert set(GPU_HOST["volumes"]) == {v[0].split(":")[0] for v in volumes}  # named volumes, no host folder
    for index, (name, worker) in enumerate(sorted(workers.items())):
        (device,) = worker["deploy"]["resources"]["reservations"]["devices"]
        assert device["device_ids"] == [str(index)], name
        assert worker["env_file"] == "../.env" and worker["healthcheck"]["test"], name
        assert worker["environment"]["HF_HOME"].startswith(worker["environment"]["LIAR_DATA_DIR"]), name
        assert worker["restart"] == "unless-stopped" and re.fullmatch(r"\d+m", worker["stop_grace_period"])


def test_the_web_host_runs_the_store_and_waits_for_it():
    assert {"postgres", "redis", "minio", "bucket", "migrate", "app", "flower"} <= set(WEB)
    needs = WEB["app"]["depends_on"]
    assert all(needs[s]["condition"] == "service_healthy" for s in ("postgres", "redis", "minio"))
    for name, service in WEB.items():
        assert service.get("healthcheck", {}).get("test"), name
        assert not [k for k in service.get("environment") or {} if re.search("PASSWORD|SECRET|AUTH", k)], name
    text = (ROOT / "deploy" / "web.yml").read_text() + (ROOT / "deploy" / "gpu-host.yml").read_text()
    assert not re.search(r"://[^/\s:@]*:[^@\s$]+@", text), "a URL with a password"


def test_the_env_example_names_the_store_and_the_token():
    example = (ROOT / "deploy.env.example").read_text()
    for key in ("LIAR_STORE", "LIAR_STORE_ENDPOINT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "HF_TOKEN"):
        assert re.search(rf"^# {key}=", example, re.M), key
    assert '".[monitor,s3]"' in (ROOT / "Dockerfile").read_text()  # the image reaches an S3 store
