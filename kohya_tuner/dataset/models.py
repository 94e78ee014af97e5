"""The values the dataset checks and preparation hand back: plain data, no rendering."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, Field

Severity = Literal["pass", "warn", "fail"]

_SEVERITY_RANK = {"pass": 0, "warn": 1, "fail": 2}


def worst(severities) -> Severity:
    """The most serious of some severities ("pass" when there are none)."""
    best: Severity = "pass"
    for s in severities:
        if _SEVERITY_RANK[s] > _SEVERITY_RANK[best]:
            best = s
    return best


class ImageInfo(BaseModel):
    """One file that is, or claims to be, a training image."""

    path: str  # relative to the scanned folder, "/"-separated, safe to print
    size_bytes: int = 0
    format: Optional[str] = None
    mode: Optional[str] = None
    # As the picture is meant to be seen, i.e. after the EXIF orientation.
    width: int = 0
    height: int = 0
    orientation: int = 1
    frames: int = 1
    has_alpha: bool = False
    sha256: Optional[str] = None
    caption_path: Optional[str] = None
    caption: Optional[str] = None
    # Codes of what is wrong with this file, see dataset.checks.PROBLEMS.
    problems: list[str] = Field(default_factory=list)
    error: Optional[str] = None
    # sd-scripts can load it as it is (it may still train badly).
    loadable: bool = False
    # sd-scripts finds it at all (extension it globs for, in a folder it reads).
    seen_by_trainer: bool = True

    @property
    def long_side(self) -> int:
        return max(self.width, self.height)

    @property
    def short_side(self) -> int:
        return min(self.width, self.height)

    @property
    def aspect(self) -> float:
        return self.long_side / self.short_side if self.short_side else 0.0

    @property
    def trainable(self) -> bool:
        return self.loadable and self.seen_by_trainer


class Finding(BaseModel):
    code: str
    severity: Severity
    message: str
    fix: Optional[str] = None
    files: list[str] = Field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.files)


class Subset(BaseModel):
    """A folder sd-scripts reads as one subset. The kohya_ss layout names folders
    `<repeats>_<class tokens>`; a plain folder has neither."""

    dir: str  # relative to the scanned folder; "" for the folder itself
    repeats: Optional[int] = None
    class_tokens: Optional[str] = None
    images: int = 0


class DatasetReport(BaseModel):
    root: str
    images: list[ImageInfo] = Field(default_factory=list)
    other_files: list[str] = Field(default_factory=list)
    orphan_captions: list[str] = Field(default_factory=list)
    subsets: list[Subset] = Field(default_factory=list)
    findings: list[Finding] = Field(default_factory=list)
    caption_extension: str = ".txt"
    # Filled by check(): what the findings were judged against.
    job: Optional[str] = None
    family: Optional[str] = None
    resolution: Optional[int] = None
    min_bucket_reso: Optional[int] = None
    max_bucket_reso: Optional[int] = None
    bucket_no_upscale: Optional[bool] = None
    trigger: Optional[str] = None

    @property
    def trainable(self) -> list[ImageInfo]:
        return [i for i in self.images if i.trainable]

    @property
    def status(self) -> Severity:
        return worst(f.severity for f in self.findings)

    def counts(self) -> dict[str, int]:
        trainable = self.trainable
        return {
            "files_seen": len(self.images) + len(self.other_files) + len(self.orphan_captions),
            "images": len(self.images),
            "trainable": len(trainable),
            "unique_trainable": len({i.sha256 or i.path for i in trainable}),
            "captioned": sum(1 for i in trainable if i.caption),
            "other_files": len(self.other_files),
            "warnings": sum(1 for f in self.findings if f.severity == "warn"),
            "failures": sum(1 for f in self.findings if f.severity == "fail"),
        }

    def to_json(self) -> dict:
        data = self.model_dump(mode="json")
        data["counts"] = self.counts()
        data["status"] = self.status
        return data


class PrepItem(BaseModel):
    source: str
    output: Optional[str] = None
    # "written" (converted or resized), "copied" (bytes unchanged), "skipped" (already
    # done by an earlier run), "failed" (not readable; nothing written).
    outcome: Literal["written", "copied", "skipped", "failed"]
    actions: list[str] = Field(default_factory=list)
    reason: Optional[str] = None


class PrepResult(BaseModel):
    source: str
    out: str
    manifest: str
    max_side: int
    trigger: Optional[str] = None
    caption_extension: str = ".txt"
    items: list[PrepItem] = Field(default_factory=list)
    captions_written: int = 0
    captions_kept: list[str] = Field(default_factory=list)  # edited by hand in the copy; left alone
    # Source captions that exist but could not be read (a pipe, a device, a file too large for a
    # caption, no permission): "name: why". Their images are copied uncaptioned (or with the trigger).
    captions_unreadable: list[str] = Field(default_factory=list)
    trigger_added: int = 0
    removed: list[str] = Field(default_factory=list)  # outputs whose source is gone
    elapsed_s: float = 0.0
    workers: int = 1

    def count(self, outcome: str) -> int:
        return sum(1 for i in self.items if i.outcome == outcome)

    @property
    def images_per_s(self) -> float:
        done = sum(1 for i in self.items if i.outcome != "failed")
        return done / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_json(self) -> dict:
        data = self.model_dump(mode="json")
        data["counts"] = {k: self.count(k) for k in ("written", "copied", "skipped", "failed")}
        data["images_per_s"] = round(self.images_per_s, 2)
        return data
