"""The names a log's records carry: the wrapper and the model family a line names (frames.toml),
and the logger, source file, tag or function of a record, which may say the phase by itself
(phase_words.toml). A mixin of the parser; its state is set up in LogParser.__init__.
"""

from __future__ import annotations

import re

from kohya_tuner.logparse import frames as F
from kohya_tuner.logparse import patterns as P
from kohya_tuner.logparse import phase_words as PW
from kohya_tuner.logparse.events import CACHE_PHASES, CACHE_READ, Event, Milestone, ModelFamily, Processes, Wrapper

# A cache reporting an entry it lacks: "Failed retrieving prompt from cache", "… not found", "could
# not load cached latents", "missing from the cache".
_CACHE_MISS_RE = re.compile(
    r"\bfail(?:ed|ure)? (?:to )?(?:retriev|load|read|find|fetch|get)\w*|\bnot found\b|\bmissing\b"
    r"|\b(?:could|can)(?:not|n't| not) (?:be )?(?:retriev|load|read|find|fetch|get)\w*|\bdoes not exist\b")


class RecordNames:
    _last_source: str | None
    _last_logger: str | None
    _last_func: str | None
    _wrapper: str | None
    _family: str | None
    _family_strength: int
    _entry_family: str | None
    _line_rank: int | None
    _processes: int

    def _source_file(self, where: str, out: list[Event]) -> None:
        """Rich's right-hand column names the file that logged (`sdxl_train.py:761`): a name
        too, looked at once per file."""
        name = where.rsplit(":", 1)[0]
        if name != self._last_source:
            self._last_source = name
            # The module that logged, not the script that ran: sd-scripts' FLUX, SD3 and SDXL
            # trainers log from train_network.py, whose name says SD 1.5 only as the script run.
            self._names(name, name.lower(), out, module=True)
            self._logger(name[:-3] if name.endswith(".py") else name, out)

    def _record_names(self, body: str, out: list[Event]) -> str:
        """A record that names its logger ("__main__ | message") or the function that logged it
        ("message (sample_image_inference)"): the names may say the phase; the message is
        returned without the logger."""
        m = P.LOGGER_BAR_RE.match(body)
        if m:
            self._logger(m.group(1), out, m.group(2))
            body = m.group(2)
        m = P.FUNC_SUFFIX_RE.search(body)
        if m and m.group(1) != self._last_func:
            self._last_func = func = m.group(1)
            ev = F.frame_evidence([f"{func}(", f"in {func}"])
            if ev is not None and ev.level == 1:
                out.append(Milestone(phase=ev.diagnose_phase, name=f"logged from {func}", line=body))
        return body

    def _logger(self, name: str, out: list[Event], message: str = "") -> None:
        """A record's logger, source file or tag that says the phase by itself (a caching
        script, a cache class): the phase from its first record on, read once per change. A
        cache's record of an entry it lacks (`message`) is a read of the cache, said apart."""
        new = name != self._last_logger
        if not new and not message:
            return
        self._last_logger = name
        if new and ("." in name or "_" in name.strip("_")):
            # A logger named for its package ("musubi_tuner.hv_train_network") or its module
            # ("hv_train_network", musubi-tuner before it became a package) names the program that
            # logs, as Rich's source column does.
            self._names(name, name.lower(), out, module=True)
        found = PW.source_phase(name)
        if found is None:
            return
        if message and found[0] in CACHE_PHASES and _CACHE_MISS_RE.search(message[:200].lower()):
            out.append(Milestone(phase=found[0], name=CACHE_READ, line=message[:300]))
        elif new:
            out.append(Milestone(phase=found[0], name=found[1], line=name, process=found[0] in CACHE_PHASES))

    def _names(self, s: str, low: str, out: list[Event], module: bool = False) -> None:
        """The wrapper and the model family a line names (frames.toml); `module`: the line is
        the name of the module that logged a record (F.names_in)."""
        wrapper, family = F.names_in(s, low, module=module)
        if family is None and self._entry_family is None and "<module>" in s and P.ENTRY_SCRIPT_RE.search(s):
            # A model's script this table does not know (musubi-tuner's forks add them): the
            # trainer it runs through names no family of its own ("" is no family's name).
            self._entry_family = ""
        if wrapper is not None and wrapper != self._wrapper and F.wrapper_rank(wrapper) < F.wrapper_rank(self._wrapper):
            self._wrapper = wrapper
            out.append(Wrapper(wrapper=wrapper, line=s))
        if family is not None:
            name, strength = family
            if "<module>" in s:
                self._entry_family = name
            elif self._entry_family is not None and name != self._entry_family and P.FRAME_LINE_RE.match(s):
                # The script that ran (its `<module>` frame) outranks the modules it calls:
                # musubi-tuner's wan_train_network.py runs through hv_train_network.py. What the
                # run logs (FLUX's script "Building Chroma model") still counts.
                return
            # Stronger evidence replaces weaker; equally strong evidence of another family is a
            # later run of another model.
            if name != self._family and strength <= self._family_strength:
                self._family = name
                self._family_strength = strength
                out.append(ModelFamily(family=name, strength=strength, line=s))
            elif name == self._family and strength < self._family_strength:
                self._family_strength = strength

    def _note_rank(self, line: str, out: list[Event]) -> None:
        """A `[rank1]:` prefix (torchrun's per-rank output) means a multi-GPU run."""
        m = P.RANK_PREFIX_RE.match(line)
        self._line_rank = int(m.group(1)) if m else None
        if self._processes < 2:
            if m and int(m.group(1)) >= 1:
                self._processes = 2
                out.append(Processes(count=2, line=line[:80]))
