"""The ``gm`` command line.

Theory of operation
-------------------
``main`` builds one argparse parser whose subcommands are each registered by a
small ``_register_<name>`` function listed in ``_REGISTRARS``. A registrar adds
its subparser and sets ``handler`` to a function ``(args) -> exit code``. The
issue that builds a subcommand replaces its registrar (and nothing else), so the
subcommands stay independent of one another.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any, TypeAlias

from gm_shell.argtypes import (
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    usage_error,
)
from gm_shell.extras import DISTRIBUTION

Handler: TypeAlias = Callable[[argparse.Namespace], int]
"""Runs a parsed subcommand and returns the process exit status."""
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def installed_version() -> str:
    """``gm-diloco X.Y.Z``, or a note that the distribution is not installed (a bare checkout)."""
    try:
        return f"{DISTRIBUTION} {version(DISTRIBUTION)}"
    except PackageNotFoundError:
        return f"{DISTRIBUTION} (not installed: running from a source tree)"


def _version(args: argparse.Namespace) -> int:
    print(installed_version())
    return 0


def _register_version(sub: Subparsers) -> None:
    p = sub.add_parser("version", help="print the installed version of gm (also: gm --version)")
    p.set_defaults(handler=_version)


def _keygen(args: argparse.Namespace) -> int:
    if args.node:
        from gm_shell.extras import MissingExtraError
        from gm_shell.nodekeys import keygen as node_keygen

        try:
            private, public = node_keygen()
        except MissingExtraError as error:
            print(f"gm keygen: {error}", file=sys.stderr)
            return 1
        print(private)
        print(
            f"public key: {public} (for the roster: gm roster --member ID:ROLES:{public})",
            file=sys.stderr,
        )
        return 0
    from gm_shell.runkey import keygen

    print(keygen())
    return 0


def _register_keygen(sub: Subparsers) -> None:
    p = sub.add_parser(
        "keygen",
        help="print a new run key (give every node it as GM_RUN_KEY; never put it in the bucket)",
    )
    p.add_argument(
        "--node",
        action="store_true",
        help="print a node's own Ed25519 private key instead (GM_NODE_KEY; its public key "
        "goes to standard error, for `gm roster`), or an authority's",
    )
    p.set_defaults(handler=_keygen)


def _register_roster(sub: Subparsers) -> None:
    """``gm roster``: the members of a run with per-node keys, signed by its authority;
    ``gm roster add``/``revoke``: admit or revoke a member of a running run (``members/``)."""
    p = sub.add_parser(
        "roster",
        help="print a roster (per-node keys) signed by an authority key: give it to the "
        "node that creates the run as GM_ROSTER_FILE; `gm roster add|revoke URL` admits or "
        "revokes a member of a running run",
    )
    _authority_arg(p, required=False)
    p.add_argument(
        "--member",
        action="append",
        metavar="ID:ROLES:PUBLIC_KEY",
        help="a node: its id, roles (learner, closer or learner+closer) and public key; repeat",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    add = actions.add_parser(
        "add", help="admit a learner to a running run: a certificate under members/"
    )
    _run_action(add)
    add.add_argument(
        "--member",
        required=True,
        metavar="ID:learner:PUBLIC_KEY",
        help="the node to admit (learners only: closers are on the manifest's roster)",
    )
    add.set_defaults(handler=_roster_add)
    revoke = actions.add_parser(
        "revoke", help="revoke a member: its objects from a round on are refused (revoked)"
    )
    _run_action(revoke)
    revoke.add_argument("--node", required=True, help="the member to revoke")
    when = revoke.add_mutually_exclusive_group()
    when.add_argument(
        "--from-round", type=int, metavar="R", help="the first round its word no longer counts"
    )
    when.add_argument(
        "--ahead",
        type=positive_int,
        default=2,
        metavar="N",
        help="else: N rounds past the tape's newest record (default 2), so that every node "
        "has read the revocation before it applies",
    )
    revoke.add_argument("--reason", default="", help="a short reason, shown by gm status")
    revoke.set_defaults(handler=_roster_revoke)

    def handler(args: argparse.Namespace) -> int:
        from gm_core import codec
        from gm_shell.extras import MissingExtraError
        from gm_shell.nodekeys import NodeKeyError, make_roster, parse_member, read_private

        if not args.member or not args.authority_key_file:
            print(
                "gm roster: give --authority-key-file and at least one --member "
                "(or: gm roster add|revoke URL)",
                file=sys.stderr,
            )
            return 2
        try:
            authority = read_private(args.authority_key_file)
            roster = make_roster(authority, [parse_member(m) for m in args.member])
        except (NodeKeyError, MissingExtraError) as error:
            print(f"gm roster: {error}", file=sys.stderr)
            return 1
        print(codec.encode(roster).decode())
        return 0

    p.set_defaults(handler=handler)


def _authority_arg(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument(
        "--authority-key-file",
        required=required,
        metavar="PATH",
        help="a file holding the authority's private key (gm keygen --node)",
    )


def _run_action(p: argparse.ArgumentParser) -> None:
    """What ``gm roster add`` and ``revoke`` need: the authority's key and the run."""
    _authority_arg(p)
    p.add_argument("url", help="mailbox URL of the run (GM_RUN_KEY or GM_RUN_KEY_FILE set)")
    p.add_argument("--endpoint", help="S3-compatible or Azure endpoint")


def _as_authority(args: argparse.Namespace, act: Callable[..., Any]) -> int:
    """Run ``act(box, run_auth, authority)`` against the run at ``args.url`` and report."""
    from gm_core.codec import CodecError
    from gm_shell.extras import MissingExtraError
    from gm_shell.mailbox import MailboxError
    from gm_shell.members import AuthorityError, MembersFullError
    from gm_shell.nodekeys import NodeKeyError, read_private
    from gm_shell.oneshot import run_oneshot
    from gm_shell.run import RunError
    from gm_shell.runkey import FROM_ENV, RunKeyError, resolve
    from gm_shell.status import open_mailbox
    from gm_shell.stores import MailboxOptions

    name = f"gm roster {args.action}"

    async def run() -> Any:
        run_auth = resolve(FROM_ENV, args.url, writes=False)
        if run_auth is None:
            raise AuthorityError("members need a run key: set GM_RUN_KEY or GM_RUN_KEY_FILE")
        box = open_mailbox(args.url, MailboxOptions(endpoint=args.endpoint))
        try:
            return await act(box, run_auth, read_private(args.authority_key_file))
        finally:
            await box.aclose()

    try:
        said = run_oneshot(run())
    except (
        AuthorityError,
        CodecError,
        MembersFullError,
        NodeKeyError,
        MissingExtraError,
        RunError,
        RunKeyError,
    ) as error:
        print(f"{name}: {error}", file=sys.stderr)
        return 1
    except MailboxError as error:
        print(f"{name}: cannot reach {args.url}: {error}", file=sys.stderr)
        return 1
    print(said)
    return 0


def _roster_add(args: argparse.Namespace) -> int:
    from gm_shell.members import admit
    from gm_shell.nodekeys import NodeKeyError, parse_member

    try:
        member = parse_member(args.member)
    except NodeKeyError as error:
        print(f"gm roster add: {error}", file=sys.stderr)
        return 1

    async def act(box: Any, run_auth: Any, authority: bytes) -> str:
        key = await admit(box, run_auth, authority, member)
        return f"admitted {member.node} as {'+'.join(member.roles)}: {key}"

    return _as_authority(args, act)


def _roster_revoke(args: argparse.Namespace) -> int:
    from gm_shell.members import shut_out

    async def act(box: Any, run_auth: Any, authority: bytes) -> str:
        key, since = await shut_out(
            box,
            run_auth,
            authority,
            args.node,
            from_round=args.from_round,
            ahead=args.ahead,
            reason=args.reason,
        )
        return f"revoked {args.node} from round {since}: {key}"

    return _as_authority(args, act)


def _register_migrate(sub: Subparsers) -> None:
    """``gm migrate OLD NEW``: a new format-2 run starting from OLD's newest commit."""
    p = sub.add_parser(
        "migrate",
        help="create at NEW an authenticated format-2 run that starts from the newest commit "
        "of the run at OLD (GM_RUN_KEY or GM_RUN_KEY_FILE: NEW's run key)",
    )
    p.add_argument("old", help="mailbox URL of the run to start from (read only)")
    p.add_argument("new", help="mailbox URL of the new run (an empty prefix)")
    p.add_argument(
        "--old-key-file",
        metavar="PATH",
        help="OLD's run key, if it was created authenticated (else it is read open)",
    )
    p.add_argument("--run-id", help="the new run's id (default: a random one)")
    p.add_argument(
        "--roster", metavar="PATH", help="a roster for the new run's per-node keys (gm roster)"
    )
    p.add_argument("--endpoint", help="S3-compatible or Azure endpoint")

    def handler(args: argparse.Namespace) -> int:
        from gm_shell.extras import MissingExtraError
        from gm_shell.mailbox import Mailbox, MailboxError
        from gm_shell.migrate import migrate
        from gm_shell.nodekeys import NodeKeyError, resolve_roster
        from gm_shell.oneshot import run_oneshot
        from gm_shell.run import RunError
        from gm_shell.runkey import FROM_ENV, RunKeyError, read_key_file, resolve
        from gm_shell.status import open_mailbox
        from gm_shell.stores import MailboxOptions

        async def run() -> str:
            new_auth = resolve(FROM_ENV, args.new, writes=False)
            if new_auth is None:
                raise RunKeyError(
                    "a format-2 run is authenticated: set GM_RUN_KEY or GM_RUN_KEY_FILE "
                    "(gm keygen prints a key) to the new run's key"
                )
            old_auth = None
            if args.old_key_file is not None:
                text = read_key_file(args.old_key_file, args.old_key_file, "a run key", RunKeyError)
                old_auth = resolve(text, args.old)
            options = MailboxOptions(endpoint=args.endpoint)
            # OLD must exist (status's check names a mistyped folder); NEW is created.
            old, new = open_mailbox(args.old, options), Mailbox.open(args.new, options=options)
            try:
                done = await migrate(
                    old,
                    new,
                    new_auth,
                    old_auth=old_auth,
                    run_id=args.run_id,
                    roster=resolve_roster(args.roster),
                )
            finally:
                await old.aclose()
                await new.aclose()
            start = "its initial parameters" if done.round < 0 else f"round {done.round}"
            stopped = f" (the walk stopped early: {done.stopped_at})" if done.stopped_at else ""
            return (
                f"created run {done.manifest.run_id} (format {done.manifest.format}, key id "
                f"{new_auth.key_id}) at {args.new} from {start} of {args.old}{stopped}"
            )

        try:
            print(run_oneshot(run()))
        except (RunError, RunKeyError, NodeKeyError, MissingExtraError) as error:
            print(f"gm migrate: {error}", file=sys.stderr)
            return 1
        except MailboxError as error:
            print(f"gm migrate: cannot read or write a bucket: {error}", file=sys.stderr)
            return 1
        return 0

    p.set_defaults(handler=handler)


def _register_demo(sub: Subparsers) -> None:
    """``gm demo``: the defaults are the tuned demo; flags exist to explore around it."""
    from gm_core.records import Alignment, WireFormat

    p = sub.add_parser("demo", help="train 4 learners through a file:// mailbox")
    p.add_argument("--name", type=_run_name, help="run folder name under --runs (default demo)")
    p.add_argument("--runs", default="runs", help="folder holding run folders (default runs)")
    p.add_argument("--learners", type=positive_int, help="learner processes (default 4)")
    p.add_argument("--steps", type=positive_int, help="optimizer steps per learner")
    p.add_argument("--sync-every", type=positive_int, help="H: local steps between syncs")
    p.add_argument("--fragments", type=positive_int, help="P: fragments (streaming DiLoCo)")
    p.add_argument("--outer-lr", type=positive_float, help="Nesterov outer learning rate")
    p.add_argument("--outer-momentum", type=_momentum, help="Nesterov outer momentum, in [0, 1)")
    p.add_argument("--alignment", choices=[a.value for a in Alignment], help="default carry")
    p.add_argument("--quorum", type=positive_int, help="snapshots a round waits for (default all)")
    p.add_argument("--in-flight", type=positive_int, help="rounds a learner may run ahead")
    p.add_argument(
        "--overlap-steps", type=non_negative_int, help="steps past an open round before waiting"
    )
    p.add_argument("--delta-format", choices=[w.value for w in WireFormat], help="default F32")
    p.add_argument("--tiny", action="store_true", help="a seconds-long smoke run")

    def handler(args: argparse.Namespace) -> int:
        learners = args.learners or (2 if args.tiny else 4)
        if args.quorum is not None and args.quorum > learners:
            return usage_error("demo", f"--quorum {args.quorum} exceeds the {learners} learners")
        from gm_shell.extras import MissingExtraError, require

        try:
            require("the demo", ("torch", "matplotlib"), extra="demo")
        except MissingExtraError as error:
            print(f"gm demo: {error}", file=sys.stderr)
            return 1
        from gm_shell.demo.launch import main  # torch loads only when the demo runs

        return main(args)

    p.set_defaults(handler=handler)


def _run_name(text: str) -> str:
    """A run folder name: one path segment, so ``--name`` cannot point outside ``--runs``."""
    if not text or text in (".", "..") or "/" in text or "\\" in text:
        raise argparse.ArgumentTypeError(f"expected a folder name, got {text!r}")
    return text


def _momentum(text: str) -> float:
    value = non_negative_float(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
    return value


def _register_simulate(sub: Subparsers) -> None:
    from gm_shell import simulate_cli

    p = sub.add_parser(
        "simulate",
        help="deterministic multi-node simulation (chaos, heterogeneity, goodput table, plots)",
    )
    simulate_cli.register(p)


def _register_check(sub: Subparsers) -> None:
    from gm_shell import check_cli

    p = sub.add_parser("check", help="exhaustive model checking of the protocol")
    check_cli.register(p)


def _register_status(sub: Subparsers) -> None:
    """``gm status URL``: reads the manifest, the newest record and a window before it.

    Exit status 0 with a summary (unreadable records are named in it), 1 when there
    is no run at the URL, its manifest is unreadable or the store cannot be read.
    """
    p = sub.add_parser("status", help="summarize a run's tape from its mailbox URL")
    p.add_argument("url", help="mailbox URL of the run, e.g. s3://bucket/run or file:///path")
    reach = p.add_mutually_exclusive_group()
    reach.add_argument(
        "--last",
        type=positive_int,
        default=20,
        metavar="N",
        help="records to summarize (default 20)",
    )
    reach.add_argument("--all", action="store_true", help="summarize the whole tape")
    p.add_argument("--json", action="store_true", help="print the status as JSON")
    p.add_argument(
        "--prices", choices=("s3", "r2"), default="s3", help="request prices (default s3)"
    )
    p.add_argument("--endpoint", help="S3-compatible or Azure endpoint (else from the environment)")
    p.add_argument(
        "--manifest-digest",
        type=_manifest_digest,
        metavar="HEX",
        help="refuse the run unless its manifest has this digest (status prints it)",
    )

    def handler(args: argparse.Namespace) -> int:
        from gm_shell import status  # the mailbox and codec load only when status runs
        from gm_shell.mailbox import MailboxError
        from gm_shell.nodekeys import NodeKeyError
        from gm_shell.oneshot import run_oneshot
        from gm_shell.run import RunError
        from gm_shell.runkey import FROM_ENV, RunKeyError, resolve
        from gm_shell.stores import MailboxOptions

        async def read() -> status.RunStatus:
            run_auth = resolve(FROM_ENV, args.url, writes=False)
            box = status.open_mailbox(args.url, MailboxOptions(endpoint=args.endpoint))
            try:
                return await status.gather_status(
                    box,
                    last=args.last,
                    everything=args.all,
                    prices=status.PRICES[args.prices],
                    run_auth=run_auth,
                    pinned=args.manifest_digest,
                )
            finally:
                await box.aclose()

        try:
            result = run_oneshot(read())
        except (RunError, RunKeyError, NodeKeyError) as error:
            print(f"gm status: {error}", file=sys.stderr)
            return 1
        except MailboxError as error:
            print(f"gm status: cannot read {args.url}: {error}", file=sys.stderr)
            return 1
        print(status.to_json(result) if args.json else status.format_status(result))
        return 0

    p.set_defaults(handler=handler)


def _manifest_digest(text: str) -> str:
    from gm_core.manifest import parse_digest

    try:
        return parse_digest(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


_REGISTRARS: tuple[Callable[[Subparsers], None], ...] = (
    _register_version,
    _register_keygen,
    _register_roster,
    _register_demo,
    _register_simulate,
    _register_check,
    _register_status,
    _register_migrate,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gm", description="Decoupled DiLoCo training over an object-store mailbox."
    )
    parser.add_argument("--version", action="version", version=installed_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in _REGISTRARS:
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``gm`` and return its exit status (2 for a usage error, as argparse prints it)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as stop:  # --help, --version, and argparse's usage errors
        return stop.code if isinstance(stop.code, int) else 2
    handler: Handler = args.handler
    return handler(args)


if __name__ == "__main__":  # ``python -m gm_shell.cli`` as well as ``python -m gm_shell``
    sys.exit(main())
