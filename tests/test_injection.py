"""Shell injection: hostile values in job.yaml, in paths and in the platform's arguments run nothing.

One job carries ``$(touch PWNED)``, backticks, ``; touch PWNED``, both kinds of quote, newlines,
non-ASCII letters and spaces in: its code directory's name, the job name, args, env values,
``prestart.env`` values, the wheel, requirements and find-links paths of the pre-start, a
pre-start command, and the arguments appended to the entrypoint. The generated scripts pass
shellcheck and are run for real (a fresh venv for the pre-start's pip, mlaunch, two workers):
no ``PWNED`` file appears anywhere, and every value arrives byte for byte in the workers' argv
and env (each worker writes them to a JSON file).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import ROOT, run_mlaunch, venv_seeing_this_python
from test_prestart_fixtures import (
    DUMP_WORKER,
    files_named,
    read_dumps,
    run_script,
    script_env,
    shellcheck,
    vendor_wheel,
)

HOSTILE_NAME = "in $(touch PWNED) `touch PWNED`; touch PWNED 'q' \"dq\"\nnew line ünïcødé 名前"


def hostile_values(sentinel: Path) -> list[str]:
    return [
        "$(touch PWNED)",
        "`touch PWNED`",
        "; touch PWNED",
        "' ; touch PWNED ; '",
        '" ; touch PWNED ; "',
        "line one\nline two; touch PWNED",
        f"$(touch {sentinel}/PWNED)",
        f"`touch {sentinel}/PWNED`",
        "${IFS}touch${IFS}PWNED",
        "\\$(touch PWNED) \\` '\\'' \\",
        "ünïcødé 名前  two  spaces ",
        "“curly” ‘quotes’ \t tab \r cr ! # ~ =",
        "=starts with equals",
        "*",
        "",
    ]


@pytest.fixture(scope="module")
def venv_sees_mlaunch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv for the pre-start's pip; mlaunch itself comes from the test interpreter's site-packages.

    mlaunch then runs on this venv's python (the entrypoint makes sure), so the workers import what
    the pre-start installed here.
    """
    return venv_seeing_this_python(tmp_path_factory.mktemp("inj-venv") / "venv", with_pip=True)


def test_hostile_values_run_nothing_and_arrive_byte_for_byte(venv_sees_mlaunch: Path, tmp_path: Path) -> None:
    sentinel = tmp_path / "sentinel"
    sentinel.mkdir()
    values = hostile_values(sentinel)
    code = tmp_path / f"code {HOSTILE_NAME}"
    wheel_dir = code / f"wheels {HOSTILE_NAME}"
    links = code / "links; touch PWNED 'x'"
    links.mkdir(parents=True)
    vendor_wheel(wheel_dir, "vendor-inj", "1.0", {"vendor_inj/__init__.py": "OK = True\n"})
    requirements = f"req {HOSTILE_NAME}.txt"
    (code / requirements).write_text("# nothing else to install\n")
    (code / "dump.py").write_text(DUMP_WORKER)
    command_text = "printf '%s\\n' 'kept $(touch PWNED) `touch PWNED` \"as is\"' > command-out.txt"
    job_env = {f"INJ_{i}": v for i, v in enumerate(values)}
    prestart_env = {f"PRE_{i}": v for i, v in enumerate(values)}
    job_name = f"job {HOSTILE_NAME}"
    job = code / "job.yaml"
    job.write_text(
        yaml.safe_dump(
            {
                "name": job_name,
                "engine": "pytorch",
                "entry": "dump.py",
                "args": values,
                "nodes": 1,
                "procs_per_node": 2,
                "env": job_env,
                "prestart": {
                    "wheels": [f"{wheel_dir.name}/vendor_inj-*.whl"],
                    "requirements": requirements,
                    "find_links": [links.name],
                    "offline": True,
                    "commands": [command_text],
                    "env": prestart_env,
                },
            },
            allow_unicode=True,
        ),
        encoding="utf-8",
    )
    for command in (["prestart", str(job)], ["entrypoint", str(job)]):
        made = run_mlaunch(command)
        assert made.returncode == 0, made.stderr
    shellcheck(code / "ma_pre_start.sh", code / "entrypoint.sh")

    dumps_dir = tmp_path / f"dumps {HOSTILE_NAME}"
    dumps_dir.mkdir()
    keys = [*job_env, *prestart_env, "MLAUNCH_JOB_NAME"]
    env = script_env(
        venv_sees_mlaunch,
        tmp_path,
        DUMP_DIR=str(dumps_dir),
        DUMP_KEYS=__import__("json").dumps(keys),
        DUMP_MODULES='["vendor_inj"]',
    )
    appended = [v for v in values if v]  # what a platform appends after the job file
    result = run_script(code / "entrypoint.sh", env, *appended, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]

    pwned = [*files_named(tmp_path, "PWNED"), *files_named(ROOT, "PWNED"), *files_named(Path.home(), "PWNED")]
    assert not pwned, f"injected commands ran: {pwned}"
    assert not Path("/PWNED").exists()

    dumps = read_dumps(dumps_dir)
    assert sorted(dumps) == [0, 1]
    for record in dumps.values():
        assert record["argv"] == [*values, *appended]
        assert record["env"] == {**job_env, **prestart_env, "MLAUNCH_JOB_NAME": job_name}
        assert record["modules"] == {"vendor_inj": True}
        assert record["cwd"] == str(code)
        assert record["executable"] == str(venv_sees_mlaunch)
    assert (code / "command-out.txt").read_text() == 'kept $(touch PWNED) `touch PWNED` "as is"\n'
    assert "[ma-pre-start] End" in result.stdout
