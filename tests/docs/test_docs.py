"""The documentation: it builds without a warning, and documents every public parameter.

What the API reference shows is what griffe (mkdocstrings' reader) finds in the
source, so completeness is judged through griffe too: a parameter or field counts
as documented when the class or function docstring's Args/Attributes section
names it, or when it has its own attribute docstring.
"""

from __future__ import annotations

import inspect
import logging
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import griffe
import pytest

from gm_core.records import Reason
from gm_shell import DiLoCo, MailboxOptions, Session, SessionOptions, events

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = griffe.load("gm_shell", search_paths=[str(ROOT / "src")])


def documented(path: str) -> set[str]:
    """Names a class or function's docs describe: its Args/Attributes and attribute docstrings."""
    obj: Any = PACKAGES[path.removeprefix("gm_shell.")]
    names: set[str] = set()
    for section in obj.docstring.parse("google") if obj.docstring else []:
        if section.kind.value in ("attributes", "parameters"):
            names |= {item.name for item in section.value if item.description.strip()}
    for name, member in getattr(obj, "members", {}).items():
        if member.is_attribute and member.docstring and member.docstring.value.strip():
            names.add(name)
    return names


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("gm_shell.session.DiLoCo", DiLoCo),
        ("gm_shell.session.SessionOptions", SessionOptions),
        ("gm_shell.stores.MailboxOptions", MailboxOptions),
    ],
)
def test_every_field_of_the_settings_classes_is_documented(path: str, kind: type) -> None:
    fields = {f.name for f in attrs.fields(kind)}
    assert fields - documented(path) == set()


def test_every_parameter_of_session_and_step_is_documented() -> None:
    params = set(inspect.signature(Session.__init__).parameters) - {"self"}
    assert params - documented("gm_shell.session.Session") == set()
    step = set(inspect.signature(Session.step).parameters) - {"self"}
    assert step - documented("gm_shell.session.Session.step") == set()


def test_every_event_field_is_documented_where_it_is_declared() -> None:
    base = {f.name for f in attrs.fields(events.Event)}
    assert base | {"kind", "level"} <= documented("gm_shell.events.Event")
    for cls in events.Event.__subclasses__():
        assert cls.__doc__, f"{cls.__name__} has no docstring"
        own = {f.name for f in attrs.fields(cls)} - base
        assert own - documented(f"gm_shell.events.{cls.__name__}") == set(), cls.__name__


def test_every_error_a_user_can_meet_says_when_it_is_raised() -> None:
    from gm_shell import RunError, RunMismatchError, StalledError, extras, mailbox

    errors = [RunError, RunMismatchError, StalledError, extras.MissingExtraError]
    errors += [
        c
        for c in vars(mailbox).values()
        if isinstance(c, type) and issubclass(c, Exception) and c.__module__ == mailbox.__name__
    ]
    for error in errors:
        assert (error.__doc__ or "").strip(), error.__name__


def test_troubleshooting_explains_every_warning_and_every_rejection_reason() -> None:
    text = (ROOT / "docs" / "guides" / "troubleshooting.md").read_text()
    explained = set(re.findall(r"^\| `(\w+)`", text, flags=re.MULTILINE))
    warnings = {c.kind for c in events.Event.__subclasses__() if c.level >= logging.WARNING}
    assert warnings - explained == set()
    assert {r.value for r in Reason} - explained == set()


def test_the_docs_build_offline_without_a_warning(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(ROOT / "src"), "NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "WARNING" not in done.stderr
    reference = (tmp_path / "reference" / "index.html").read_text()
    anchors = set(re.findall(r'id="(gm_(?:shell|core)\.[\w.]+)"', reference))
    assert {
        "gm_shell.Session",
        "gm_shell.Session.step",
        "gm_shell.DiLoCo",
        "gm_shell.SessionOptions",
        "gm_shell.MailboxOptions.read_timeout_s",
        "gm_shell.align.align",
        "gm_shell.events.Rejected",
        "gm_shell.StalledError",
        "gm_shell.mailbox.BucketMissingError",
        "gm_core.advice.advise",
    } <= anchors
