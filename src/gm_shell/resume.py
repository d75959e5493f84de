"""Resuming a node exactly: its own training state, kept in the bucket beside the shared model.

Theory of operation
-------------------
The bucket keeps the shared model at every commit; a restarted node joins from the
newest one. What it does not keep is what this node's own training needs to go on
where it was. ``Session(..., resume=state)`` names that: a mapping of names to
values. A value with ``state_dict()`` and ``load_state_dict()`` (a torch optimizer,
an LR scheduler, a stateful data loader or sampler, an object of the user's) is
saved through the first and restored in place through the second; any other value
(a number, a dict of them, a tensor) is saved as it is and restored into the
mapping. The session adds its step count, so ``Session.step_count`` goes on too.

When to save is :mod:`gm_core.resume`'s decision (at commit boundaries, once per
sync cycle by default; on joining and on closing). A save is captured on the
training thread between optimizer steps: the state is copied into one buffer
there, since ``state_dict()`` hands out the optimizer's live tensors, which the
next step overwrites. Hashing and uploading run on the session's event loop, one
save at a time: a save that falls due while the previous one is still uploading
waits for the next boundary.

The session adds its parameters' local progress at each boundary save (per fragment:
the parameters minus a base, with the steps and tokens since it; see
:mod:`gm_core.resume`, which decides on a restart which fragments get it back).

The object at ``keys.resume(node)``: :data:`MAGIC`, the 32-byte blake3 of the
rest (keyed by the run key's resume subkey in an authenticated run, so that an
outsider cannot write a state a restarting node loads), then a safetensors file
whose tensors (``"0"``, ``"1"``, ...) are the state's tensors and whose metadata
holds, as JSON under ``"gm-resume"``, the run id, the node, the round and step of
the save, the state's structure and, when saved, the progress (``"progress"``: per
fragment its anchor version, base round, steps, tokens and an fp32 array). In that
structure containers and tensors are tagged (``{"list": [...]}``, ``{"tuple":
[...]}``, ``{"dict": [[key, value], ...]}``, ``{"torch": i}``, ``{"numpy": i}``,
``{"scalar": i}``), so tuples, integer keys, dtypes and devices' tensors come
back as what they were (tensors on the CPU; ``load_state_dict`` moves an
optimizer's to its parameters' device).

Reading treats the bytes as hostile: an object over the size limit is refused
before its body is downloaded, the digest must match, the safetensors header is
checked entry by entry (:mod:`gm_shell.payload`), the structure's nesting is
bounded and every tag, index and dtype checked, and a state another run or node
wrote is refused. Each refusal is a :class:`ResumeError` that names the key, what
is wrong and how to start afresh; nothing is restored before everything decoded.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import math
import sys
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any, Protocol, runtime_checkable

import attrs
import blake3
import numpy as np

from gm_core import auth, keys
from gm_core import resume as core_resume
from gm_core.auth import RunAuth, Signing
from gm_core.numerics.arrays import F32
from gm_core.resume import Drift
from gm_shell import events, nodekeys
from gm_shell.loopthread import LoopThread
from gm_shell.mailbox import Mailbox, TooLargeError
from gm_shell.payload import PayloadError, TensorEntry, header_bytes, read_payload
from gm_shell.run import read_manifest
from gm_shell.runkey import FROM_ENV, RunKey
from gm_shell.runkey import resolve as resolve_run_key
from gm_shell.stores import MailboxOptions

MAGIC = b"gm-resume/1\n"
"""The first bytes of a resume object (the format's version is in it)."""

DIGEST_BYTES = 32
SIGNATURE_BYTES = 64
"""An Ed25519 signature, after the body of a state saved in a run with per-node keys."""
MAX_DEPTH = 64
"""Deepest nesting of containers a resume state may have (optimizer states use 4)."""

META = "gm-resume"
"""The safetensors metadata entry that holds the JSON document."""

_TORCH_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U64": "uint64",
    "U32": "uint32",
    "U16": "uint16",
    "U8": "uint8",
    "BOOL": "bool",
}
"""Safetensors dtype names of the torch dtypes a resume state can hold."""

_NUMPY_DTYPES = {
    code: name for code, name in _TORCH_DTYPES.items() if code not in ("BF16", "F8_E4M3", "F8_E5M2")
}
"""The same for numpy (which has no bfloat16 or float8)."""


class ResumeError(RuntimeError):
    """The node's saved resume state cannot be read or stored; the message says why and
    what to do (its key, to delete it and start this node afresh)."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(
            f"resume state {key!r}: {problem}. To start this node afresh, delete that object "
            "(or start it with another node id)"
        )
        self.key = key
        self.problem = problem


@runtime_checkable
class Stateful(Protocol):
    """What torch optimizers, LR schedulers and stateful data loaders offer."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any, /) -> Any: ...


Progress = tuple[tuple[Drift, F32], ...]
"""Per fragment: where its local progress is measured from, and the progress (fp32)."""

_PROGRESS_FIELDS = ("version", "base_round", "steps", "tokens", "drift")


@attrs.frozen(kw_only=True)
class Saved:
    """A decoded resume state: where it was saved, and the values (not yet restored)."""

    round: int
    step: int
    values: dict[str, Any]
    progress: Progress | None = None
    """The parameters' local progress at the save (None: saved without, on joining or closing)."""
    adopted: tuple[int, str] | None = None
    """The round and chain digest of the newest record the node had adopted at the save
    (None: none yet, or saved by a gm before this field): a restarted node checks that the
    tape it joins descends from it (spec/protocol.md §16.5.2)."""


# -- encoding ----------------------------------------------------------------------------


class _Packer:
    """Turns a state into a JSON tree and a list of tensors' bytes (views, copied once later)."""

    def __init__(self) -> None:
        self.entries: list[TensorEntry] = []
        self.views: list[memoryview] = []

    def pack(self, value: Any, path: str) -> Any:
        if isinstance(value, np.ndarray | np.generic):  # before float: np.float64 is one
            tag = "numpy" if isinstance(value, np.ndarray) else "scalar"
            return {tag: self._numpy(np.asarray(value), path)}
        if value is None or isinstance(value, bool | int | float | str):
            return value
        if isinstance(value, list):
            return {"list": [self.pack(v, f"{path}[{i}]") for i, v in enumerate(value)]}
        if isinstance(value, tuple):
            return {"tuple": [self.pack(v, f"{path}[{i}]") for i, v in enumerate(value)]}
        if isinstance(value, Mapping):
            return {
                "dict": [
                    [self.pack(k, f"{path} key {k!r}"), self.pack(v, f"{path}[{k!r}]")]
                    for k, v in value.items()
                ]
            }
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(value, torch.Tensor):
            return {"torch": self._torch(value, path)}
        raise TypeError(
            f"resume state {path}: a {type(value).__name__} cannot be saved; use numbers, "
            "strings, lists, tuples, dicts, torch tensors, numpy arrays, or an object with "
            "state_dict() and load_state_dict()"
        )

    def _add(self, code: str, shape: tuple[int, ...], raw: np.ndarray) -> int:
        self.entries.append(TensorEntry(name=str(len(self.entries)), dtype=code, shape=shape))
        self.views.append(raw.data.cast("B"))
        return len(self.entries) - 1

    def _torch(self, value: Any, path: str) -> int:
        name = str(value.dtype).removeprefix("torch.")
        code = next((c for c, n in _TORCH_DTYPES.items() if n == name), None)
        if code is None:
            raise TypeError(f"resume state {path}: torch dtype {name} cannot be saved")
        flat = value.detach().to("cpu").contiguous().reshape(-1)
        return self._add(code, tuple(value.shape), flat.view(sys.modules["torch"].uint8).numpy())

    def _numpy(self, value: np.ndarray, path: str) -> int:
        native = value.dtype.newbyteorder("=")
        code = next((c for c, n in _NUMPY_DTYPES.items() if np.dtype(n) == native), None)
        if code is None:
            raise TypeError(f"resume state {path}: numpy dtype {value.dtype} cannot be saved")
        little = np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<")).reshape(-1)
        return self._add(code, tuple(value.shape), little.view(np.uint8))


def capture(state: Mapping[str, Any]) -> dict[str, Any]:
    """What a save stores of ``state``: ``state_dict()`` of stateful values, others as they are."""
    return {name: v.state_dict() if isinstance(v, Stateful) else v for name, v in state.items()}


def encode(
    values: Mapping[str, Any],
    *,
    run: str,
    node: str,
    round: int,
    step: int,
    progress: Progress | None = None,
    adopted: tuple[int, str] | None = None,
) -> bytearray:
    """The object for ``values`` (and ``progress``) with its digest left blank (:func:`seal`
    fills it in).

    Copies every tensor once, into the returned buffer, so the caller may go on
    training while the buffer is sealed and uploaded.
    """
    packer = _Packer()
    tree = packer.pack(dict(values), "")
    document = {"run": run, "node": node, "round": round, "step": step, "state": tree}
    if adopted is not None:
        document["adopted"] = list(adopted)
    if progress is not None:
        document["progress"] = packer.pack(
            [
                {**attrs.asdict(drift), "drift": np.ascontiguousarray(array, dtype=np.float32)}
                for drift, array in progress
            ],
            "progress",
        )
    header = header_bytes(packer.entries, {META: json.dumps(document, separators=(",", ":"))})
    prefix = len(MAGIC) + DIGEST_BYTES
    out = bytearray(prefix + len(header) + sum(v.nbytes for v in packer.views))
    out[: len(MAGIC)] = MAGIC
    at = prefix
    for part in (header, *packer.views):
        out[at : at + len(part)] = part
        at += len(part)
    return out


def seal(
    data: bytearray,
    digest_key: bytes | None = None,
    signing: Signing | None = None,
    *,
    run: str = "",
    key: str = "",
) -> bytes:
    """Fill in the digest of an :func:`encode` buffer (CPU work: a worker thread's); keyed
    BLAKE3 under ``digest_key`` in an authenticated run (:func:`digest_key`). With per-node
    keys (``signing`` of a node that signs), the node's signature over the digest, the run
    id and the object's ``key`` follows the body (:data:`SIGNATURE_BYTES`): no other member
    can write a state this node would load."""
    start = len(MAGIC) + DIGEST_BYTES
    digest = _digest(memoryview(data)[start:], digest_key)
    data[len(MAGIC) : start] = digest
    if signing is None or signing.sign is None:
        return bytes(data)
    return bytes(data) + signing.sign(auth.signed_message(run, key, digest))


def digest_key(run_auth: RunAuth | None) -> bytes | None:
    """The key of resume digests in a run authenticated by ``run_auth`` (None: an open run)."""
    return None if run_auth is None else run_auth.resume_key


def _digest(body: memoryview, key: bytes | None) -> bytes:
    hasher = blake3.blake3() if key is None else blake3.blake3(key=key)
    return hasher.update(body).digest()


# -- decoding ----------------------------------------------------------------------------


class _RefusedError(Exception):
    """A reason to refuse the bytes; :func:`decode` turns it into a ResumeError with the key."""


def decode(
    data: bytes,
    *,
    run: str,
    node: str,
    key: str,
    digest_key: bytes | None = None,
    signing: Signing | None = None,
) -> Saved:
    """Check and decode a resume object of ``node`` in run ``run``; :class:`ResumeError` if not.

    ``digest_key``: the run's (:func:`digest_key`) in an authenticated run; ``signing``: its
    per-node keys (the object must then carry ``node``'s own signature, :func:`seal`).
    """
    try:
        if signing is not None:
            data = _signed_by(data, signing, run, node, key)
        return _decode(data, run, node, digest_key)
    except _RefusedError as refused:
        raise ResumeError(key, str(refused)) from None


def _signed_by(data: bytes, signing: Signing, run: str, node: str, key: str) -> bytes:
    """``data`` without its signature, when it is ``node``'s over the object's digest."""
    member = signing.members.get(node)
    if member is None:
        raise _RefusedError(f"node {node!r} is not on the run's roster")
    start = len(MAGIC) + DIGEST_BYTES
    if len(data) < start + SIGNATURE_BYTES:
        raise _RefusedError("not signed (the run has per-node keys)")
    body, signature = data[:-SIGNATURE_BYTES], data[-SIGNATURE_BYTES:]
    message = auth.signed_message(run, key, body[len(MAGIC) : start])
    if not signing.verify(bytes.fromhex(member.public_key), message, signature):
        raise _RefusedError(f"not signed by {node} (per-node keys): another member wrote it")
    return body


def _decode(data: bytes, run: str, node: str, digest_key: bytes | None) -> Saved:
    start = len(MAGIC) + DIGEST_BYTES
    if len(data) < start or not data.startswith(MAGIC):
        raise _RefusedError("not a resume state (no gm-resume/1 header)")
    view = memoryview(data)
    if _digest(view[start:], digest_key) != data[len(MAGIC) : start]:
        written = "" if digest_key is None else ", or written without the run key"
        raise _RefusedError(f"its digest does not match its bytes (corrupt or altered{written})")
    try:
        payload = read_payload(view[start:])
        document = json.loads(payload.metadata.get(META, "null"))
    except (PayloadError, ValueError, RecursionError) as error:
        raise _RefusedError(f"malformed: {error}") from None
    fields = {"run", "node", "round", "step", "state"}
    optional = {"progress", "adopted"}
    if not isinstance(document, dict) or not fields <= set(document) <= fields | optional:
        raise _RefusedError("malformed: its document lacks run, node, round, step or state")
    if (document["run"], document["node"]) != (run, node):
        raise _RefusedError(
            f"saved by node {document['node']!r} of run {document['run']!r}, not by "
            f"{node!r} of run {run!r}"
        )
    saved_round, step = document["round"], document["step"]
    if not (_integer(saved_round) and saved_round >= -1 and _integer(step) and step >= 0):
        raise _RefusedError(f"malformed: round {saved_round!r} and step {step!r}")
    tensors = [payload.tensors.get(str(i)) for i in range(len(payload.tensors))]
    unpacker = _Unpacker([t for t in tensors if t is not None])
    if len(unpacker.tensors) != len(tensors):
        raise _RefusedError("malformed: its tensors are not numbered 0, 1, ...")
    values = unpacker.unpack(document["state"], 0)
    if not isinstance(values, dict) or not all(isinstance(k, str) for k in values):
        raise _RefusedError("malformed: the state is not a mapping of names")
    progress = None
    if "progress" in document:
        progress = _progress(unpacker.unpack(document["progress"], 0))
    adopted = _adopted(document.get("adopted"))
    return Saved(round=saved_round, step=step, values=values, progress=progress, adopted=adopted)


def _adopted(value: Any) -> tuple[int, str] | None:
    """The saved ``[round, digest]`` of the newest adopted record, checked."""
    if value is None:
        return None
    if not (isinstance(value, list) and len(value) == 2):
        raise _RefusedError("malformed: adopted is not [round, digest]")
    round_, digest = value
    if not (_integer(round_) and 0 <= round_ < keys.ROUND_LIMIT):
        raise _RefusedError(f"malformed: adopted round {round_!r}")
    if not (isinstance(digest, str) and keys.valid_digest(digest)):
        raise _RefusedError("malformed: adopted digest")
    return round_, digest


def _progress(tree: Any) -> Progress:
    """Check the decoded progress entries' fields, types and signs."""
    if not isinstance(tree, list):
        raise _RefusedError("malformed: its progress is not a list")
    out = []
    for entry in tree:
        if not isinstance(entry, dict) or tuple(entry) != _PROGRESS_FIELDS:
            fields = ", ".join(_PROGRESS_FIELDS)
            raise _RefusedError(f"malformed: a progress entry without {fields}")
        numbers = [entry[name] for name in _PROGRESS_FIELDS[:-1]]
        lowest = (0, -1, 0, 0)
        if not all(_integer(n) and n >= low for n, low in zip(numbers, lowest, strict=True)):
            raise _RefusedError(f"malformed: progress counts {numbers!r}")
        drift = entry["drift"]
        if not (isinstance(drift, np.ndarray) and drift.dtype == np.float32 and drift.ndim == 1):
            raise _RefusedError("malformed: a fragment's progress is not a flat fp32 array")
        version, base_round, steps, tokens = numbers
        counts = Drift(version=version, base_round=base_round, steps=steps, tokens=tokens)
        out.append((counts, drift))
    return tuple(out)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _Unpacker:
    def __init__(self, tensors: list[Any]) -> None:
        self.tensors = tensors

    def unpack(self, node: Any, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise _RefusedError(f"malformed: nested deeper than {MAX_DEPTH}")
        if node is None or isinstance(node, bool | int | float | str):
            return node
        if not isinstance(node, dict) or len(node) != 1:
            raise _RefusedError("malformed: a value this format does not write")
        ((tag, body),) = node.items()
        if tag in ("list", "tuple", "dict") and not isinstance(body, list):
            raise _RefusedError(f"malformed: {tag} without a list")
        if tag == "list":
            return [self.unpack(item, depth + 1) for item in body]
        if tag == "tuple":
            return tuple(self.unpack(item, depth + 1) for item in body)
        if tag == "dict":
            return dict(self._pair(pair, depth + 1) for pair in body)
        if tag in ("torch", "numpy", "scalar"):
            if not _integer(body) or not 0 <= body < len(self.tensors):
                raise _RefusedError(f"malformed: tensor {body!r} of {len(self.tensors)}")
            return self._tensor(tag, self.tensors[body])
        raise _RefusedError(f"malformed: unknown tag {tag!r}")

    def _pair(self, pair: Any, depth: int) -> tuple[Any, Any]:
        if not isinstance(pair, list) or len(pair) != 2:
            raise _RefusedError("malformed: a dict entry is not a [key, value] pair")
        key = self.unpack(pair[0], depth)
        try:
            hash(key)
        except TypeError:
            raise _RefusedError(f"malformed: dict key {key!r} cannot be a key") from None
        return key, self.unpack(pair[1], depth)

    def _tensor(self, tag: str, view: Any) -> Any:
        code, shape = view.entry.dtype, view.entry.shape
        if tag == "torch":
            if code not in _TORCH_DTYPES:
                raise _RefusedError(f"malformed: torch tensor of dtype {code}")
            try:
                import torch
            except ImportError:
                raise _RefusedError("it holds torch tensors and torch is not installed") from None
            dtype = getattr(torch, _TORCH_DTYPES[code])
            if view.data.shape[0] == 0:
                return torch.empty(shape, dtype=dtype)
            return torch.frombuffer(bytearray(view.data), dtype=dtype).reshape(shape)
        if code not in _NUMPY_DTYPES:
            raise _RefusedError(f"malformed: numpy array of dtype {code}")
        array = view.data.view(np.dtype(_NUMPY_DTYPES[code]).newbyteorder("<"))
        array = array.reshape(shape).astype(_NUMPY_DTYPES[code])  # a native-order copy
        return array if tag == "numpy" else array[()]


def restore(state: MutableMapping[str, Any], values: Mapping[str, Any]) -> None:
    """Load ``values`` into ``state``: in place into stateful values, else by replacing them.

    Names saved but no longer in ``state`` are ignored; names new in ``state`` keep
    their values.
    """
    for name, value in values.items():
        if name not in state:
            continue
        if isinstance(state[name], Stateful):
            state[name].load_state_dict(value)
        else:
            state[name] = value


# -- the node's saver --------------------------------------------------------------------


class Resumer:
    """One node's resume state: restored once on joining, saved at commit boundaries.

    Its methods run on the training thread; uploads run on the session's loop.
    ``sizes`` are the run's fragment sizes, which saved progress must match.
    """

    def __init__(
        self,
        state: MutableMapping[str, Any],
        *,
        mailbox: Mailbox,
        loop: LoopThread,
        run: str,
        node: str,
        every: int,
        max_bytes: int,
        sizes: tuple[int, ...] = (),
        digest_key: bytes | None = None,
        adopted: Callable[[], tuple[int, str] | None] = lambda: None,
        check: Callable[[Saved], None] = lambda saved: None,
        signing: Signing | None = None,
    ) -> None:
        self.state = state
        self._signing = signing
        self._adopted = adopted
        self._check = check
        self._digest_key = digest_key
        self._sizes = sizes
        self.key = keys.resume(node)
        self.saved_round = -1
        self._mailbox = mailbox
        self._loop = loop
        self._run = run
        self._node = node
        self._every = every
        self._max_bytes = max_bytes
        self._pending: concurrent.futures.Future[None] | None = None

    def restore(self) -> Saved | None:
        """Read this node's saved state and restore it into :attr:`state` (None: none saved)."""
        try:
            got = self._loop.run(self._mailbox.get(self.key, max_bytes=self._max_bytes))
        except TooLargeError as error:
            raise ResumeError(
                self.key,
                f"{error.size:,} bytes, over SessionOptions.resume_max_bytes ({error.limit:,})",
            ) from None
        if got is None:
            return None
        saved = decode(
            got.data,
            run=self._run,
            node=self._node,
            key=self.key,
            digest_key=self._digest_key,
            signing=self._signing,
        )
        self._check_progress(saved.progress)
        self._check(saved)
        try:
            restore(self.state, saved.values)
        except Exception as error:  # e.g. an optimizer built for other parameters now
            raise ResumeError(self.key, f"loading it failed: {error}") from error
        return saved

    def _check_progress(self, progress: Progress | None) -> None:
        if progress is None:
            return
        sizes = tuple(len(array) for _, array in progress)
        if sizes != self._sizes:
            raise ResumeError(
                self.key,
                f"its progress has fragments of {sizes} values, the run's are {self._sizes}",
            )
        if not all(np.isfinite(array).all() for _, array in progress):
            raise ResumeError(self.key, "its progress holds non-finite values")

    def due(self, aligned_round: int) -> bool:
        """Whether a boundary save is due now and none is uploading."""
        if not core_resume.due(aligned_round, self.saved_round, self._every):
            return False
        return self._pending is None or self._pending.done()

    def at_boundary(self, aligned_round: int, step: int, progress: Progress | None = None) -> None:
        """After a barrier step where :meth:`due`: start a save (with the parameters' local
        progress, taken at this step) that uploads in the background."""
        data = self._capture(aligned_round, step, progress)
        self._pending = asyncio.run_coroutine_threadsafe(
            self._upload(data, aligned_round, step, raising=False), self._loop.loop
        )

    def save(self, aligned_round: int, step: int, *, raising: bool = True) -> None:
        """Save now and wait until it is stored (joining; closing, where a failed upload
        is only logged, as at a boundary, since the training it would save is over)."""
        if self._pending is not None:
            concurrent.futures.wait([self._pending])
        data = self._capture(aligned_round, step)
        self._loop.run(self._upload(data, aligned_round, step, raising=raising))

    def _capture(
        self, aligned_round: int, step: int, progress: Progress | None = None
    ) -> bytearray:
        values = capture(self.state)
        run, node = self._run, self._node
        data = encode(
            values,
            run=run,
            node=node,
            round=aligned_round,
            step=step,
            progress=progress,
            adopted=self._adopted(),
        )
        if len(data) > self._max_bytes:
            raise ResumeError(
                self.key,
                f"this node's state takes {len(data):,} bytes, over "
                f"SessionOptions.resume_max_bytes ({self._max_bytes:,}), so it could not be "
                "read back; raise that limit",
            )
        self.saved_round = aligned_round
        return data

    async def _upload(self, data: bytearray, aligned_round: int, step: int, raising: bool) -> None:
        sealed = await asyncio.to_thread(
            functools.partial(seal, run=self._run, key=self.key),
            data,
            self._digest_key,
            self._signing,
        )
        try:
            await self._mailbox.put(self.key, sealed)
        except Exception as error:
            if raising:
                raise
            events.LOG.warning("%s: could not save its resume state: %s", self._node, error)
            return
        events.LOG.info(
            "%s: saved its resume state at step %d (round %d, %s bytes)",
            self._node,
            step,
            aligned_round,
            f"{len(sealed):,}",
        )


def default_max_bytes(parameters: int) -> int:
    """The size limit on a node's resume state when none is set: room for 4 fp32 values per
    synchronized parameter (Adam's two moments take 2) plus 64 MiB for everything else."""
    return 16 * parameters + (64 << 20)


def read_saved(
    url: str,
    node: str,
    *,
    run_key: RunKey = FROM_ENV,
    options: MailboxOptions | None = None,
    max_bytes: int | None = None,
) -> Saved | None:
    """The resume state ``node`` saved in the run at ``url``, read without joining the run
    (checked as on a restart; None: the run or the state does not exist yet). For what has
    to know the saved step before a session starts, e.g. a Trainer that skips the data its
    node trained (:meth:`gm_shell.integrations.hf.GmTrainerCallback.trainer_checkpoint`)."""
    run_auth = resolve_run_key(run_key, url)
    loop = LoopThread(f"gm-resume-{node}")
    box = Mailbox.open(url, options=options)
    try:
        manifest = loop.run(read_manifest(box, run_auth))
        if manifest is None:
            return None
        parameters = sum(math.prod(t.shape) for t in manifest.schema)
        limit = max_bytes or default_max_bytes(parameters)
        key = keys.resume(node)
        try:
            got = loop.run(box.get(key, max_bytes=limit))
        except TooLargeError as error:
            raise ResumeError(key, f"{error.size:,} bytes, over the limit ({limit:,})") from None
        if got is None:
            return None
        run, digest = manifest.run_id, digest_key(run_auth)
        reading = nodekeys.reader(run_auth, manifest)
        signing = None if reading is None else reading.signing
        return decode(got.data, run=run, node=node, key=key, digest_key=digest, signing=signing)
    finally:
        loop.stop()
        box.close()
