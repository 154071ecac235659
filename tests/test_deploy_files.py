"""deploy/ checked statically: no container engine or cluster runs on these machines.

What is checked: every file parses (YAML, JSON, TOML, Dockerfile instructions, shell syntax);
every environment variable the files give the platform is one it reads; the commands they run
exist (entry-point roles, manage.py commands and their flags, executables, COPY sources); the
compose services' images, ports and URLs agree with each other; the Kubernetes objects refer to
each other consistently; the Grafana dashboard plots only metrics /metrics exposes.
What is not: building the images, pulling the third-party ones, running anything.
"""
from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from django.conf import settings

ROOT = Path(settings.BASE_DIR)
DEPLOY = ROOT / "deploy"
PLATFORM_DOCKERFILE = DEPLOY / "Dockerfile"
SANDBOX_DOCKERFILE = DEPLOY / "sandbox-tools" / "Dockerfile"
ENTRYPOINT = DEPLOY / "entrypoint.sh"
COMPOSE = DEPLOY / "docker-compose.yml"
K8S = DEPLOY / "k8s" / "trajplatform.yaml"
DASHBOARD = DEPLOY / "grafana-dashboard.json"
PLATFORM_SERVICES = ("migrate", "web", "worker", "offline-model")

# Variables the platform image sets for Python, pip and libraries, not for the settings.
RUNTIME_VARS = {
    "PATH", "VIRTUAL_ENV", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONPATH",
    "PIP_DISABLE_PIP_VERSION_CHECK", "PIP_NO_CACHE_DIR", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
    "FASTMCP_CHECK_FOR_UPDATES",
}
ENV_READ = re.compile(
    r"""(?:env_(?:str|bool|int|float|list)\(|os\.environ\.get\(|os\.environ\[|os\.getenv\()\s*["']([A-Z][A-Z0-9_]*)["']""")
DOCKERFILE_INSTRUCTIONS = {
    "FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME", "USER", "WORKDIR",
    "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL",
}


def platform_env_vars() -> set[str]:
    """Every environment variable the platform's code reads (settings and modules), plus the
    LLM providers' own variables."""
    from apps.engines.llm import NAMED_PROVIDERS, VLLM_API_KEY_VAR

    names = {VLLM_API_KEY_VAR}
    for provider in NAMED_PROVIDERS.values():
        names.update(v for v in (provider.key_var, provider.url_var, provider.model_var) if v)
    for folder in ("trajplatform", "apps"):
        for path in (ROOT / folder).rglob("*.py"):
            names.update(ENV_READ.findall(path.read_text(encoding="utf-8")))
    return names


def unknown_env_vars(names: Any) -> set[str]:
    return set(names) - platform_env_vars() - RUNTIME_VARS


def dockerfile(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction, continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued instruction
        pending += " " + line[:-1] if line.endswith("\\") else " " + line
        if not line.endswith("\\"):
            word, _, rest = pending.strip().partition(" ")
            instructions.append((word.upper(), rest.strip()))
            pending = ""
    assert not pending, f"{path}: a continued line never ends"
    return instructions


def dockerfile_env(instructions: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for word, rest in instructions:
        if word == "ENV":
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                env[key] = value
    return env


def entrypoint_roles() -> set[str]:
    return set(re.findall(r"^\s+([a-z][a-z-]*)\)\s*$", ENTRYPOINT.read_text(), re.M))


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def k8s_objects() -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(K8S.read_text()) if doc]


def env_file(path: Path) -> dict[str, str]:
    pairs = [line.split("=", 1) for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return {key: value for key, value in pairs}


def url_of(env: dict[str, Any], name: str) -> Any:
    """The URL in env[name], each compose interpolation (${VAR:?message}) replaced by a word."""
    return urlsplit(re.sub(r"\$\{[^}]*\}", "x", str(env[name])))


# --- parsing ------------------------------------------------------------------------------


def test_every_deploy_file_parses():
    assert set(compose()["services"]) >= {"postgres", "redis", "opensandbox-server", *PLATFORM_SERVICES}
    assert {(o["kind"], o["metadata"]["name"]) for o in k8s_objects()} >= {
        ("Secret", "trajplatform-secrets"), ("ConfigMap", "trajplatform-config"), ("Job", "trajplatform-migrate"),
        ("Deployment", "trajplatform-web"), ("Deployment", "trajplatform-worker"), ("Service", "trajplatform-web")}
    assert json.loads(DASHBOARD.read_text())["panels"]
    assert tomllib.loads((DEPLOY / "opensandbox" / "sandbox.toml").read_text())["server"]["port"] == 8080
    for path in (PLATFORM_DOCKERFILE, SANDBOX_DOCKERFILE):
        instructions = dockerfile(path)
        assert instructions[0][0] == "FROM" and {w for w, _ in instructions} <= DOCKERFILE_INSTRUCTIONS, path
    subprocess.run(["sh", "-n", str(ENTRYPOINT)], check=True)


def test_the_dockerfile_parser_sees_a_misspelled_instruction(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.11-slim-bookworm\nRUN true \\\n  && true\nCOPPY a b\n")
    assert [w for w, _ in dockerfile(bad)] == ["FROM", "RUN", "COPPY"]


# --- environment variables ------------------------------------------------------------------


def test_every_variable_given_to_the_platform_is_one_it_reads():
    services = compose()["services"]
    given: dict[str, set[str]] = {
        "deploy/Dockerfile ENV": set(dockerfile_env(dockerfile(PLATFORM_DOCKERFILE))),
        "deploy/trajplatform.env.example": set(env_file(DEPLOY / "trajplatform.env.example")),
    }
    for name in PLATFORM_SERVICES:
        given[f"compose service {name}"] = set(services[name]["environment"])
    for obj in k8s_objects():
        if obj["kind"] == "ConfigMap":
            given["k8s ConfigMap"] = set(obj["data"])
        if obj["kind"] == "Secret":
            given["k8s Secret"] = set(obj["stringData"])
    assert {where: unknown_env_vars(names) for where, names in given.items()} == {where: set() for where in given}


def test_the_check_catches_a_misspelled_variable():
    assert unknown_env_vars({"DJANGO_SECRETKEY", "REDIS_URL", "GEMINI_API_KEY"}) == {"DJANGO_SECRETKEY"}


def test_the_compose_env_example_fills_only_what_the_compose_file_uses():
    used = set(re.findall(r"\$\{([A-Z][A-Z0-9_]*)", COMPOSE.read_text()))
    assert set(env_file(DEPLOY / "compose.env.example")) <= used


def test_every_machine_gets_the_same_secret_key_from_outside():
    """A key generated per machine breaks the queue: django-q2 signs jobs with it."""
    env = compose()["services"]["web"]["environment"]
    assert env["DJANGO_SECRET_KEY"].startswith("${DJANGO_SECRET_KEY:?")
    for name in PLATFORM_SERVICES:
        assert compose()["services"][name]["environment"] == env  # one anchor for all
    secret = next(o for o in k8s_objects() if o["kind"] == "Secret")
    assert "DJANGO_SECRET_KEY" in secret["stringData"]


# --- commands -------------------------------------------------------------------------------


def test_the_commands_the_files_run_exist():
    from django.core.management import get_commands, load_command_class

    roles = entrypoint_roles()
    assert roles >= {"web", "worker", "offline-model", "migrate", "manage"}
    for name in PLATFORM_SERVICES:
        assert compose()["services"][name]["command"][0] in roles, name
    for obj in k8s_objects():
        for container in obj.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
            assert container["args"][0] in roles, obj["metadata"]["name"]
    # The manage.py commands the entry point and the systemd units run, with their flags.
    commands = get_commands()
    text = ENTRYPOINT.read_text() + "".join(p.read_text() for p in DEPLOY.glob("*.service"))
    used = set(re.findall(r"python manage\.py (\w+)", text))
    assert used >= {"qcluster", "offline_model", "migrate"} and used <= set(commands), used - set(commands)
    parser = load_command_class(commands["offline_model"], "offline_model").create_parser("manage.py", "offline_model")
    parser.parse_args(["--host", "0.0.0.0", "--port", "8765"])
    # The executables: daphne from the virtualenv the image builds (the same lock as ours).
    assert re.search(r"exec daphne ", ENTRYPOINT.read_text())
    assert (Path(sys.executable).parent / "daphne").exists() or shutil.which("daphne")
    # Each COPY source is in the repository (the build context is its root).
    for path in (PLATFORM_DOCKERFILE, SANDBOX_DOCKERFILE):
        for word, rest in dockerfile(path):
            if word == "COPY":
                for source in shlex.split(rest)[:-1]:
                    if not source.startswith("--"):
                        assert (ROOT / source).exists(), f"{path.name}: COPY {source}"


def test_the_platform_image_installs_the_locked_packages_and_its_entry_point():
    instructions = dockerfile(PLATFORM_DOCKERFILE)
    run = " ".join(rest for word, rest in instructions if word == "RUN")
    assert "-r requirements.lock" in run and "torch==$TORCH_VERSION" in run
    torch = next(line for line in (ROOT / "requirements.lock").read_text().splitlines() if line.startswith("torch=="))
    assert f"ARG TORCH_VERSION={torch.split('==')[1]}" in PLATFORM_DOCKERFILE.read_text()
    assert ("ENTRYPOINT", '["trajplatform-entrypoint"]') in instructions
    assert "COPY deploy/entrypoint.sh /usr/local/bin/trajplatform-entrypoint" in PLATFORM_DOCKERFILE.read_text()


def test_the_sandbox_tools_image_has_the_platforms_pinned_sandbox_side_packages():
    from apps.engines.sandboxes.base import PLATFORM_MCP_BUILTIN_PATH, PLATFORM_MCP_PATH, PLATFORM_PYTHON_PATH

    lock = dict(line.split("==", 1) for line in (ROOT / "requirements.lock").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    wanted = [line for line in (DEPLOY / "sandbox-tools" / "requirements.txt").read_text().splitlines()
              if line and not line.startswith("#")]
    assert {"fastmcp", "playwright", "miniwob", "pytest"} <= {w.split("==")[0] for w in wanted}
    for line in wanted:
        name, version = line.split("==")
        assert lock.get(name) == version, f"{name}=={version} is not the platform's {lock.get(name)}"
    env = dockerfile_env(dockerfile(SANDBOX_DOCKERFILE))
    assert env["PYTHONPATH"].split(":") == [PLATFORM_PYTHON_PATH, f"{PLATFORM_MCP_PATH}/python", PLATFORM_MCP_BUILTIN_PATH]
    text = SANDBOX_DOCKERFILE.read_text()
    assert "-r /tmp/build/requirements-mcp.lock" in text and "npm ci --prefix /opt/trajplatform/mcp/node" in text
    assert re.search(r"install -y .*\bchromium\b", text.replace("\\\n", " "))


# --- compose consistency --------------------------------------------------------------------


def test_the_compose_services_agree_on_images_ports_and_addresses():
    services = compose()["services"]
    platform_images = {services[name]["image"] for name in PLATFORM_SERVICES}
    assert len(platform_images) == 1
    assert services["web"]["build"]["dockerfile"] == "deploy/Dockerfile"
    assert (COMPOSE.parent / services["web"]["build"]["context"] / "deploy" / "Dockerfile").exists()
    assert (COMPOSE.parent / services["sandbox-tools"]["build"]["context"]
            / services["sandbox-tools"]["build"]["dockerfile"]).exists()
    for name, service in services.items():
        image = service["image"]
        assert ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest"), f"{name}: pin {image}"
        for dependency in service.get("depends_on", {}):
            assert dependency in services, f"{name} depends on unknown {dependency}"
        if service.get("build"):
            assert not Path(service["build"]["context"]).is_absolute()
    env = services["worker"]["environment"]
    database = url_of(env, "DATABASE_URL")
    assert database.hostname == "postgres" and database.port == 5432
    assert database.username == services["postgres"]["environment"]["POSTGRES_USER"]
    assert database.path.lstrip("/") == services["postgres"]["environment"]["POSTGRES_DB"]
    redis = url_of(env, "REDIS_URL")
    assert redis.hostname == "redis" and redis.port == 6379
    sandbox = url_of(env, "OPENSANDBOX_URL")
    port = tomllib.loads((DEPLOY / "opensandbox" / "sandbox.toml").read_text())["server"]["port"]
    assert sandbox.hostname == "opensandbox-server" and sandbox.port == port
    assert str(port) in services["opensandbox-server"]["expose"]
    assert env["OPENSANDBOX_DEFAULT_IMAGE"] == services["sandbox-tools"]["image"]
    assert env["SANDBOX_BACKEND"] == "opensandbox"
    model = url_of(env, "OFFLINE_MODEL_URL")
    assert model.hostname == "offline-model" and str(model.port) in services["offline-model"]["expose"]
    assert f"OFFLINE_MODEL_PORT:-{model.port}" in ENTRYPOINT.read_text()
    web_port = int(services["web"]["ports"][0].rsplit(":", 1)[1])
    assert f"PORT:-{web_port}" in ENTRYPOINT.read_text()
    exposed = {int(p) for word, rest in dockerfile(PLATFORM_DOCKERFILE) if word == "EXPOSE" for p in rest.split()}
    assert {web_port, model.port} <= exposed
    assert "PLATFORM_SKILLS_URL" in env and {"LLM_BASE_URL", "LLM_API_KEY", "LLM_MODEL", "LLM_PROVIDERS"} <= set(env)


# --- Kubernetes -----------------------------------------------------------------------------


def test_the_kubernetes_objects_refer_to_each_other():
    objects = k8s_objects()
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    images = set()
    for obj in objects:
        assert obj["apiVersion"] and obj["metadata"]["name"]
        spec = obj.get("spec", {})
        if obj["kind"] == "Deployment":
            assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
        pod = spec.get("template", {}).get("spec", {})
        for container in pod.get("containers", []):
            images.add(container["image"])
            for source in container.get("envFrom", []):
                ref = source.get("configMapRef") or source.get("secretRef")
                kind = "ConfigMap" if "configMapRef" in source else "Secret"
                assert (kind, ref["name"]) in names
            ports = {p["name"] for p in container.get("ports", [])}
            for probe in ("readinessProbe", "livenessProbe"):
                if probe in container:
                    assert container[probe]["tcpSocket"]["port"] in ports
    assert len(images) == 1
    service = next(o for o in objects if o["kind"] == "Service")
    web = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "trajplatform-web")
    assert service["spec"]["selector"].items() <= web["spec"]["template"]["metadata"]["labels"].items()
    secret = next(o for o in objects if o["kind"] == "Secret")
    assert {"DJANGO_SECRET_KEY", "DATABASE_URL", "REDIS_URL", "OPENSANDBOX_API_KEY", "LLM_API_KEY"} <= set(secret["stringData"])


# --- Grafana --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_dashboard_plots_only_metrics_the_platform_exposes():
    from trajplatform.health import render_metrics

    exposed = set(re.findall(r"^# TYPE (\w+) ", render_metrics(), re.M))
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    plotted = {name for expr in exprs for name in re.findall(r"\b(trajplatform_\w+)", expr)}
    assert plotted and plotted <= exposed, plotted - exposed
    assert exposed <= plotted, f"exposed but not plotted: {exposed - plotted}"
