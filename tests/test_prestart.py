"""``mlaunch prestart``: the generated ma_pre_start.sh is shellcheck-clean and does what it says when run.

The scripts run with bash against a real, fresh virtual environment and real wheels (written by
the test with mlaunch's wheel writer, installed by pip with ``--no-index``). What is checked: the
install order, the env it exports and persists, the second run that changes nothing, a rebuilt
wheel with an unchanged version, cleanup that removes only what it matched, secrets never shown
or written, offline mode, two runs at once, and the user errors that stop generation.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import run_mlaunch
from test_prestart_fixtures import make_venv, pip_freeze, run_script, script_env, shellcheck, vendor_wheel

PREFIX = "[ma-pre-start] "


def write_job(code: Path, prestart: dict[str, Any] | None = None, **fields: Any) -> Path:
    code.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {"name": "prestart-test", "engine": "pytorch", "entry": "train.py", **fields}
    if prestart is not None:
        data["prestart"] = prestart
    path = code / "job.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return path


def generate(job: Path, *extra: str) -> Path:
    result = run_mlaunch(["prestart", str(job), *extra])
    assert result.returncode == 0, result.stderr
    return Path(result.stdout.strip().splitlines()[-1])


def read_env_file(path: Path) -> dict[str, str]:
    records = path.read_bytes().split(b"\0")
    assert records[-1] == b""
    return dict(r.decode().split("=", 1) for r in records[:-1])


def tree(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under root with its content and mtime: what "changes nothing" is measured on."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            out[str(path.relative_to(root))] = (path.read_bytes(), path.stat().st_mtime_ns)
    return out


def assert_prefixed(output: str) -> None:
    bad = [line for line in output.splitlines() if not line.startswith(PREFIX)]
    assert not bad, f"lines without {PREFIX!r}: {bad}"


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_venv(tmp_path_factory.mktemp("prestart-venv") / "venv")


def module_value(python: Path, expr: str, env: dict[str, str]) -> str:
    out = subprocess.run([str(python), "-c", f"print({expr})"], capture_output=True, text=True, env=env, cwd="/")
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


# ----------------------------------------------------------------------------------------
# Generation
# ----------------------------------------------------------------------------------------

WEIRD = 'it\'s "quoted" $(touch PWNED) `touch PWNED`; touch PWNED\nsecond line ünïcødé $HOME \\ *'

CONFIGS: dict[str, dict[str, Any] | None] = {
    "no prestart section": None,
    "full": {
        "wheels": ["dist/mlaunch-*.whl", "vendor/vendor_a-*.whl"],
        "requirements": "requirements.txt",
        "commands": ['echo "$HOME" | tr a-z A-Z', "python -c 'print(1)'"],
        "env": {"GLOG_v": "2", "WEIRD": WEIRD},
        "passthrough": ["HF_TOKEN", "AWS_SECRET_ACCESS_KEY"],
        "cleanup": True,
        "offline": True,
        "find_links": ["wheels dir", "/opt/wheels"],
    },
    "absolute dir": {"dir": "/home/ma-user/modelarts/inputs/data_url_0/", "wheels": ["mindx_elastic-*.whl"]},
    "odd paths": {"dir": "in $(put) `here`", "wheels": ["a b/c'd $(x)-*.whl"], "requirements": "r $(q).txt"},
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_generated_prestart_passes_shellcheck(tmp_path: Path, name: str) -> None:
    job = write_job(tmp_path / "code", CONFIGS[name], python="/opt/py thon/bin/python3" if name == "full" else None)
    script = generate(job)
    assert script == tmp_path / "code" / "ma_pre_start.sh"
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash\n") and "\nset -euo pipefail\n" in text
    assert os.access(script, os.X_OK)
    shellcheck(script)


def test_stdout_output_and_notes(tmp_path: Path) -> None:
    job = write_job(tmp_path / "code", {"wheels": ["dist/mlaunch-*.whl"]})
    result = run_mlaunch(["prestart", str(job), "-o", "-"])
    assert result.returncode == 0 and result.stdout.startswith("#!/usr/bin/env bash")
    assert "nothing matches 'dist/mlaunch-*.whl'" in result.stderr  # the wheel was not built yet
    assert not (tmp_path / "code" / "ma_pre_start.sh").exists()


@pytest.mark.parametrize(
    ("prestart", "message"),
    [
        ({"wheels": ["/abs/x.whl"]}, "must stay inside prestart.dir"),
        ({"wheels": ["../up/x.whl"]}, "must stay inside prestart.dir"),
        ({"wheels": ["dist/*"]}, "must name wheel files"),
        ({"wheels": [" "]}, "is empty"),
        ({"env": {"API_TOKEN": "abc"}}, "looks like a secret"),
        ({"env": {"DB_PASSWORD": ""}}, "looks like a secret"),
        ({"env": {"BAD-NAME": "1"}}, "not a valid environment variable name"),
        ({"passthrough": ["not valid"]}, "not a valid environment variable name"),
        ({"env": {"FOO": "1"}, "passthrough": ["FOO"]}, "also set in prestart.env"),
        ({"requirements": ""}, "is empty"),
        ({"wheel": ["x.whl"]}, "Did you mean 'wheels'"),
    ],
)
def test_bad_prestart_sections_are_user_errors(tmp_path: Path, prestart: dict[str, Any], message: str) -> None:
    job = write_job(tmp_path / "code", prestart)
    result = run_mlaunch(["prestart", str(job)])
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "code" / "ma_pre_start.sh").exists()


def test_secret_in_env_names_the_line(tmp_path: Path) -> None:
    job = write_job(tmp_path / "code", {"env": {"GLOG_v": "2", "HF_TOKEN": "hf_abc"}})
    result = run_mlaunch(["prestart", str(job)])
    assert result.returncode == 2
    assert "line" in result.stderr and "HF_TOKEN looks like a secret" in result.stderr
    assert "hf_abc" not in result.stderr and "prestart.passthrough" in result.stderr


def test_output_into_missing_directory(tmp_path: Path) -> None:
    job = write_job(tmp_path / "code", {})
    result = run_mlaunch(["prestart", str(job), "-o", str(tmp_path / "nope" / "ma_pre_start.sh")])
    assert result.returncode == 2 and "does not exist" in result.stderr


# ----------------------------------------------------------------------------------------
# Execution
# ----------------------------------------------------------------------------------------


def vendor_set(root: Path) -> dict[str, Path]:
    """vendor_a (a module), vendor_b (needs vendor_c, found only through find_links), vendor_c."""
    wheels = {
        "a": vendor_wheel(root / "vendor", "vendor-a", "1.0", {"vendor_a/__init__.py": "WHO = 'a-1'\n"}),
        "b": vendor_wheel(
            root / "vendor", "vendor-b", "1.0", {"vendor_b/__init__.py": "WHO = 'b'\n"}, requires=["vendor-c>=1"]
        ),
        "c": vendor_wheel(root / "links", "vendor-c", "1.0", {"vendor_c/__init__.py": "WHO = 'c'\n"}),
        "r": vendor_wheel(root / "links", "vendor-r", "2.0", {"vendor_r/__init__.py": "WHO = 'r'\n"}),
    }
    (root / "requirements.txt").write_text("vendor-r==2.0\n")
    return wheels


def test_installs_in_order_runs_commands_and_persists_env(venv: Path, tmp_path: Path) -> None:
    code = tmp_path / "code"
    vendor_set(code)
    env_values = {"GLOG_v": "2", "WEIRD": WEIRD, "EMPTY": ""}
    job = write_job(
        code,
        {
            "wheels": ["vendor/vendor_b-*.whl", "vendor/vendor_a-*.whl"],
            "requirements": "requirements.txt",
            "commands": ["python -c 'import vendor_a, vendor_b, vendor_c, vendor_r; print(\"imports ok\")' > done.txt"],
            "env": env_values,
            "offline": True,
            "find_links": ["links"],
        },
    )
    script = generate(job)
    env = script_env(venv, tmp_path)
    first = run_script(script, env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert_prefixed(first.stdout)
    out = first.stdout
    assert out.index("Start to install vendor_b") < out.index("Start to install vendor_a") < out.index("pip install -r")
    assert (code / "done.txt").read_text() == "imports ok\n"  # commands ran after the installs, with venv's python
    assert read_env_file(code / "ma_pre_start.env") == {**env_values, "MLAUNCH_PYTHON": str(venv)}
    assert module_value(venv, "__import__('vendor_a').WHO", env) == "a-1"
    assert not list(tmp_path.rglob("PWNED"))

    # a second run in the same container changes nothing and succeeds
    before_freeze, before_tree = pip_freeze(venv), tree(code)
    second = run_script(script, env)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "nothing to install" in second.stdout and "Successfully installed" not in second.stdout
    assert pip_freeze(venv) == before_freeze and tree(code) == before_tree

    # a fresh container (no marker) with the packages already there: pip installs nothing again
    for marker in Path(env["TMPDIR"]).glob("mlaunch-prestart-*"):
        marker.unlink()
    third = run_script(script, env)
    assert third.returncode == 0, third.stdout + third.stderr
    assert "already installed: vendor_a-1.0" in third.stdout and "already installed: vendor_b-1.0" in third.stdout
    assert "Start to install" not in third.stdout
    assert pip_freeze(venv) == before_freeze


def test_rebuilt_wheel_with_the_same_version_is_reinstalled(venv: Path, tmp_path: Path) -> None:
    code = tmp_path / "code"
    vendor_wheel(code / "vendor", "vendor-a", "1.0", {"vendor_a/__init__.py": "WHO = 'a-1'\n"})
    script = generate(write_job(code, {"wheels": ["vendor/vendor_a-*.whl"], "offline": True}))
    env = script_env(venv, tmp_path)
    assert run_script(script, env).returncode == 0
    vendor_wheel(code / "vendor", "vendor-a", "1.0", {"vendor_a/__init__.py": "WHO = 'a-1 rebuilt'\n"})
    for marker in Path(env["TMPDIR"]).glob("mlaunch-prestart-*"):
        marker.unlink()
    result = run_script(script, env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "reinstalling vendor_a-1.0" in result.stdout
    assert module_value(venv, "__import__('vendor_a').WHO", env) == "a-1 rebuilt"


def test_missing_wheel_stops_with_its_name(venv: Path, tmp_path: Path) -> None:
    code = tmp_path / "code"
    vendor_wheel(code / "vendor", "vendor-late", "1.0", {"vendor_late/__init__.py": ""})
    script = generate(write_job(code, {"wheels": ["mindx_elastic-*.whl", "vendor/vendor_late-*.whl"]}))
    result = run_script(script, script_env(venv, tmp_path))
    assert result.returncode == 1
    assert "[ma-pre-start] error: no wheel matches mindx_elastic-*.whl in" in result.stderr
    assert "vendor-late" not in " ".join(pip_freeze(venv))  # it stopped there: nothing after it was installed
    assert not (code / "ma_pre_start.env").exists()


def test_cleanup_removes_only_the_wheels_it_matched(venv: Path, tmp_path: Path) -> None:
    code = tmp_path / "code"
    matched = vendor_wheel(code / "pkgs", "vendor-clean", "1.0", {"vendor_clean/__init__.py": ""})
    kept = vendor_wheel(code / "other", "vendor-keep", "1.0", {"vendor_keep/__init__.py": ""})
    outside = vendor_wheel(tmp_path, "vendor-clean", "0.9", {"vendor_clean/__init__.py": ""})
    (code / "pkgs" / "notes.txt").write_text("keep me\n")
    script = generate(write_job(code, {"wheels": ["pkgs/vendor_clean-*.whl"], "cleanup": True}))
    env = script_env(venv, tmp_path)
    first = run_script(script, env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert not matched.exists() and kept.exists() and outside.exists() and (code / "pkgs" / "notes.txt").exists()
    assert "removed pkgs/vendor_clean-1.0-py3-none-any.whl" in first.stdout
    second = run_script(script, env)  # the wheel is gone, the run is a no-op all the same
    assert second.returncode == 0 and "nothing to install" in second.stdout


def test_secrets_are_passed_through_never_shown_or_written(venv: Path, tmp_path: Path) -> None:
    code = tmp_path / "code"
    secret = "s3cr3t-Value-0123456789"
    script = generate(write_job(code, {"env": {"GLOG_v": "2"}, "passthrough": ["HF_TOKEN", "MISSING_KEY"]}))
    env = script_env(venv, tmp_path, HF_TOKEN=secret)
    result = run_script(script, env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert secret not in result.stdout + result.stderr
    assert "HF_TOKEN passed through from the platform env (value not shown)" in result.stdout
    assert "warning: MISSING_KEY is not set" in result.stdout
    for root in (code, tmp_path):
        for path in root.rglob("*"):
            if path.is_file():
                assert secret.encode() not in path.read_bytes(), path
    assert "HF_TOKEN" not in read_env_file(code / "ma_pre_start.env")


def test_offline_installs_nothing_from_an_index(venv: Path, tmp_path: Path) -> None:
    code = tmp_path / "code"
    vendor_wheel(code, "vendor-needy", "1.0", {"vendor_needy/__init__.py": ""}, requires=["vendor-nowhere>=1"])
    script = generate(write_job(code, {"wheels": ["vendor_needy-*.whl"], "offline": True}))
    result = run_script(script, script_env(venv, tmp_path))
    assert result.returncode == 1
    assert "pip install" in result.stderr and "vendor_needy-1.0-py3-none-any.whl failed" in result.stderr
    assert "vendor-nowhere" in result.stdout  # pip's own reason, prefixed, in the log


def test_two_runs_at_once_install_once(venv: Path, tmp_path: Path) -> None:
    code = tmp_path / "code"
    vendor_wheel(code, "vendor-once", "1.0", {"vendor_once/__init__.py": ""})
    script = generate(write_job(code, {"wheels": ["vendor_once-*.whl"], "offline": True}))
    env = script_env(venv, tmp_path)
    results: list[subprocess.CompletedProcess[str]] = []
    threads = [threading.Thread(target=lambda: results.append(run_script(script, env))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.returncode for r in results] == [0, 0], [r.stdout + r.stderr for r in results]
    combined = "".join(r.stdout for r in results)
    assert combined.count("Successfully installed vendor-once-1.0") == 1
    assert combined.count("nothing to install") == 1


def test_helper_keeps_an_editable_install(tmp_path: Path) -> None:
    """An editable install (PEP 610 direct_url.json) is a developer's checkout: never replaced.

    The dist-info below is the on-disk format pip writes for ``pip install -e``; building a real
    editable install here would need a build backend from a registry.
    """
    site = tmp_path / "site"
    info = site / "vendor_dev-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vendor-dev\nVersion: 1.0\n")
    (info / "RECORD").write_text("vendor_dev-1.0.dist-info/METADATA,,\n")
    (info / "direct_url.json").write_text('{"dir_info": {"editable": true}, "url": "file:///src/vendor-dev"}')
    wheel = vendor_wheel(tmp_path, "vendor-dev", "1.0", {"vendor_dev/__init__.py": ""})
    helper = Path(__file__).resolve().parent.parent / "launchers" / "generate" / "prestart_helper.py"
    env = {**os.environ, "PYTHONPATH": str(site)}
    result = subprocess.run(
        [sys.executable, str(helper), "installed", str(wheel)], capture_output=True, text=True, env=env
    )
    assert result.returncode == 3 and "/src/vendor-dev" in result.stdout
    env["PYTHONPATH"] = str(tmp_path / "empty")
    result = subprocess.run(
        [sys.executable, str(helper), "installed", str(wheel)], capture_output=True, text=True, env=env
    )
    assert result.returncode == 1


def test_sh_filter_round_trips_hostile_values_and_keeps_shellcheck_quiet(tmp_path: Path) -> None:
    """The ``sh`` filter every template uses: random hostile strings come back byte for byte from
    bash, and a script holding all of them is shellcheck-clean (no exclusions)."""
    import random

    from launchers.templating import sh_join, sh_quote

    alphabet = list("$`\\'\"\n\t\r ;|&<>(){}[]*?!#~=%^-_aZ09") + ["ü", "名", "“", "’", "$(", "${", "\\'", "'\\"]
    rng = random.Random(1234)
    values = ["", "$", "\\", "'", "a\\", "\\'"] + [
        "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 24))) for _ in range(300)
    ]
    script = tmp_path / "values.sh"
    body = "".join(f"v={sh_quote(v)}\nprintf '%s\\0' \"$v\"\n" for v in values)
    script.write_text(f"#!/usr/bin/env bash\nset -euo pipefail\n{body}printf '%s\\0' {sh_join(values)}\n")
    shellcheck(script)
    out = subprocess.run(["bash", str(script)], capture_output=True, check=True).stdout
    expected = b"".join(v.encode() + b"\0" for v in values)
    assert out == expected * 2


def test_mlaunch_check_reports_the_prestart_section(tmp_path: Path) -> None:
    code = tmp_path / "code"
    job = write_job(code, {"wheels": ["dist/mlaunch-*.whl"], "env": {"GLOG_v": "2"}})
    (code / "train.py").write_text("")
    result = run_mlaunch(["check", str(job)])
    assert result.returncode == 0, result.stderr
    assert "ok: prestart: 1 wheel pattern(s), 1 env value(s)" in result.stdout
    assert "warning: prestart.wheels: nothing matches 'dist/mlaunch-*.whl'" in result.stdout
    bad = write_job(code, {"wheels": ["../x.whl"]})
    result = run_mlaunch(["check", str(bad)])
    assert result.returncode == 2 and "must stay inside prestart.dir" in result.stderr
