"""What a capture tool, a terminal or a paste does to a whole log must not change its reading: a
prefix on every line (journalctl, a time, docker's `-t`, line numbers), a common indent (a markdown
code block), trailing spaces, a markdown fence, colour codes, and the encodings a Windows console
writes (UTF-16 without a BOM, cp932, GBK, cp1252). Each class is tried in several spellings on
labelled real logs (tests/data/public_logs), whose transformed text must diagnose as the original
does (outcome, phase, step, error kind), read from disk the way `kohya-tuner diagnose` reads it."""

from __future__ import annotations

import io

import pytest

from kohya_tuner.logparse import diagnose
from kohya_tuner.logparse.inputform import FormFilter, sniff_form
from kohya_tuner.logparse.reader import events_from_stream, iter_events, open_log
from tests.logparse_labels import PUBLIC

# Labelled logs of every kind (GPU and host OOM, CUDA errors, other errors, cut tracebacks, runs cut
# before any error) whose lines a prefix or an indent used to change the reading of.
SAMPLE = ("006", "007", "009", "011", "015", "043", "1034", "1090", "1308", "117")


def original(name: str) -> str:
    return (PUBLIC / f"{name}.log").read_bytes().decode("utf-8")


def reading(path, coalesce: bool = True) -> tuple:
    d = diagnose(iter_events(open_log(path), coalesce_progress=coalesce))
    return d.outcome, d.phase, d.step, d.error.kind if d.error else None


def read_bytes(tmp_path, data: bytes, coalesce: bool = True) -> tuple:
    path = tmp_path / "t.log"
    path.write_bytes(data)
    return reading(path, coalesce)


def per_line(text: str, prefix) -> str:
    """`prefix(n)` before every line, blank lines too, as a capture tool writes it."""
    lines = text.split("\n")
    end = lines.pop() if lines[-1] == "" else None
    out = "\n".join(prefix(n) + line for n, line in enumerate(lines, 1))
    return out + "\n" if end is not None else out


PREFIXES = {
    "journal": lambda n: f"May 01 12:{n // 60 % 60:02}:{n % 60:02} gpu-box python3[4242]: ",
    "journal_short_day": lambda n: f"Jan  5 03:04:{n % 60:02} node-7 train.sh[77]: ",
    "journal_iso": lambda n: f"2024-05-01T12:00:{n % 60:02}+0000 gpu-box python3[4242]: ",
    "time_pipe": lambda n: f"2024-05-01 12:{n // 60 % 60:02}:{n % 60:02} | ",
    "time_pipe_ms": lambda n: f"2024-05-01 12:00:{n % 60:02}.{n % 1000:03} | ",
    "time": lambda n: f"2024-05-01 12:{n // 60 % 60:02}:{n % 60:02} ",
    "time_t": lambda n: f"2024-05-01T12:{n // 60 % 60:02}:{n % 60:02} ",
    "docker": lambda n: f"2024-05-01T12:{n // 60 % 60:02}:{n % 60:02}.{n:09}Z ",
    "docker_zone": lambda n: f"2024-05-01T12:00:{n % 60:02}.{n:06}+00:00 ",
    "cat_n": lambda n: f"{n:6}\t",
    "lineno_colon": lambda n: f"{n}: ",
    "lineno_pipe": lambda n: f"{n:4} | ",
    "lineno_pipe_bare": lambda n: f"{n} | ",
}


@pytest.mark.parametrize("name", SAMPLE)
@pytest.mark.parametrize("form", PREFIXES)
def test_a_prefix_on_every_line_is_taken_off(tmp_path, name, form):
    want = reading(PUBLIC / f"{name}.log")
    assert read_bytes(tmp_path, per_line(original(name), PREFIXES[form]).encode()) == want


@pytest.mark.parametrize("name", SAMPLE)
@pytest.mark.parametrize("indent", ["    ", "\t", "  ", "        ", "> " + "    "])
def test_a_common_indent_is_taken_off(tmp_path, name, indent):
    text = original(name)
    # A code block's blank lines carry no indent (editors trim them); a quoted one keeps its "> ".
    blank = "> " if indent.startswith("> ") else ""
    indented = "\n".join(indent + line if line.strip() else blank for line in text.split("\n"))
    assert read_bytes(tmp_path, indented.encode()) == reading(PUBLIC / f"{name}.log")


def test_the_reported_repros_read_as_their_plain_text(tmp_path):
    plain = ('Loading settings from /cfg.toml...\nTraceback (most recent call last):\n'
             '  File "/sd/train_network.py", line 10, in <module>\n    main()\nKeyError: 1\n')
    want = read_bytes(tmp_path, plain.encode())
    assert want[:2] == ("error", "model_load")
    piped = per_line(plain, lambda n: f"2024-05-01 12:00:0{n % 10} | ")
    assert read_bytes(tmp_path, piped.encode()) == want
    block = ('    Traceback (most recent call last):\n      File "/sd/train_network.py", line 900, in train\n'
             '        accelerator.backward(loss)\n'
             '    torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n')
    assert read_bytes(tmp_path, block.encode())[0] == "oom"


@pytest.mark.parametrize("chunk", [1, 7, 64, 97, 1 << 20])
def test_a_prefix_split_between_reads_is_still_taken_off(chunk):
    text = per_line(original("009"), PREFIXES["journal"])
    form = sniff_form(text, complete=True)
    assert form is not None and form.prefix == "journal"
    whole = FormFilter(form).feed(text, final=True)
    assert whole == original("009")
    events = events_from_stream(io.BytesIO(text.encode()), "utf-8", chunk_size=chunk, form=form)
    plain = events_from_stream(io.BytesIO(original("009").encode()), "utf-8", chunk_size=chunk)
    assert [e.to_dict() for e in events] == [e.to_dict() for e in plain]


# A log's own layout is no capture tool's prefix: Rich's time column on a record's first line, a
# logger's time and level on every line, srun's rank labels out of order, Rich's blank time column.
@pytest.mark.parametrize("text", [
    "2024-05-01 12:00:01 INFO     Loading settings        train_util.py:4651\n"
    "2024-05-01 12:00:02 INFO     prepare images.         train_util.py:2072\n",
    "2023-07-12 02:50:34 | ERROR | stderr | Traceback (most recent call last):\n"
    '2023-07-12 02:50:34 | ERROR | stderr |   File "x.py", line 1, in <module>\n',
    "2024-05-25 13:51:00,012 | INFO | /w/kohya_gui/common_gui.py | end of toml config file\n"
    "2024-05-25 13:51:03,717 | INFO | /w/kohya_gui/lora_gui.py | Start training LoRA Standard ...\n",
    "1: Traceback (most recent call last):\n0: Traceback (most recent call last):\n1:   File \"x.py\"\n",
    "                    INFO     epoch is incremented.             train_util.py:784\n"
    "                             current_epoch: 0, epoch: 1\n",
])
def test_a_logs_own_layout_is_kept(text):
    assert sniff_form(text, complete=True) is None


# ---- trailing spaces, fences ---------------------------------------------------------------------

@pytest.mark.parametrize("name", ("011", "1005", "1466", "1964", "614", "870"))
@pytest.mark.parametrize("tail", ["   ", "\t", " "])
def test_trailing_spaces_do_not_matter(tmp_path, name, tail):
    text = "\n".join(line + tail for line in original(name).split("\n"))
    assert read_bytes(tmp_path, text.encode()) == reading(PUBLIC / f"{name}.log")


def test_a_bar_cut_at_its_start_with_trailing_spaces_is_step_zero(tmp_path):
    text = "Steps:   0%|   \nRuntimeError: CUDA error: invalid argument\n"
    assert read_bytes(tmp_path, text.encode())[1:3] == ("first_step", 0)


FENCED = {
    "fence": lambda t: "```\n" + t.rstrip("\n") + "\n```\n",
    "fence_lang": lambda t: "```shell\n" + t.rstrip("\n") + "\n```\n",
    "tildes": lambda t: "~~~text\n" + t.rstrip("\n") + "\n~~~\n",
    "quoted": lambda t: "".join("> " + line + "\n" for line in ("```\n" + t.rstrip("\n") + "\n```").split("\n")),
    "closing_only": lambda t: t.rstrip("\n") + "\n```\n",
}


@pytest.mark.parametrize("name", ("1101", "1148", "1158", "1283", "1549", "2163", "323", "365", "559", "996"))
@pytest.mark.parametrize("form", FENCED)
def test_a_markdown_fence_is_nothing(tmp_path, name, form):
    assert read_bytes(tmp_path, FENCED[form](original(name)).encode()) == reading(PUBLIC / f"{name}.log")


def test_a_fence_after_an_error_line_does_not_hide_it(tmp_path):
    text = "Fatal error in launcher: Unable to create process using python.exe\n"
    want = read_bytes(tmp_path, text.encode())
    assert want[0] == "error"
    assert read_bytes(tmp_path, (text + "```\n").encode()) == want


# ---- encodings ---------------------------------------------------------------------------------

# Logs full of Rich's boxes (U+2500 is 00 25 in UTF-16, NULs on both sides of the bytes) or of CJK text
# (few ASCII characters, few NULs).
@pytest.mark.parametrize("name", ("076", "097", "105", "1068", "1078", "1132", "2245", "2262"))
@pytest.mark.parametrize("eol", ["\r\n", "\n"])
def test_utf16_without_bom_holding_box_characters(tmp_path, name, eol):
    data = original(name).replace("\n", eol).encode("utf-16-le")
    assert read_bytes(tmp_path, data) == reading(PUBLIC / f"{name}.log")


def _cjk(codec: str) -> list[str]:
    """Labelled logs holding Japanese or Chinese text that the code page writes exactly."""
    names = []
    for path in sorted(PUBLIC.glob("*.log")):
        text = path.read_bytes().decode("utf-8")
        if not any("\u3040" <= ch <= "\u9fff" for ch in text):
            continue
        try:
            text.encode(codec)
        except UnicodeEncodeError:
            continue
        names.append(path.stem)
    return names


@pytest.mark.parametrize("codec", ["cp932", "gbk"])
def test_cjk_code_pages(tmp_path, codec):
    names = _cjk(codec)
    assert len(names) >= 5
    changed = [n for n in names if read_bytes(tmp_path, original(n).encode(codec)) != reading(PUBLIC / f"{n}.log")]
    assert changed == []


@pytest.mark.parametrize("codec", ["cp932", "gbk", "utf-8"])
def test_a_japanese_no_data_error(tmp_path, codec):
    text = ("ERROR    No data found. Please verify arguments (train_data_dir must be the parent of folders with "
            "images)\n/ 画像がありません。引数指定を確認してください\n")
    path = tmp_path / "j.log"
    path.write_bytes(text.encode(codec))
    d = diagnose(iter_events(open_log(path), coalesce_progress=True))
    assert (d.outcome, d.error.kind if d.error else None) == ("error", "missing_file")
    assert open_log(path).encoding == codec


@pytest.mark.parametrize("text", [
    "没有找到数据，请检查参数\nFileNotFoundError: [Errno 2] 没有那个文件或目录: 'D:/训练/模型.safetensors'\n",
    "加载模型失败\nRuntimeError: 显存不足\n",
])
def test_chinese_gbk_is_read_as_gbk(tmp_path, text):
    path = tmp_path / "c.log"
    path.write_bytes(text.encode("gbk"))
    assert open_log(path).encoding == "gbk"
    d = diagnose(iter_events(open_log(path), coalesce_progress=True))
    assert d.error is not None and d.error.message.split(": ", 1)[-1] in text


@pytest.mark.parametrize("word", ["José", "Müller", "Café_v2", "façade"])
def test_a_western_windows_console_is_cp1252(tmp_path, word):
    text = f"FileNotFoundError: [Errno 2] No such file or directory: 'C:\\Users\\{word}\\model.safetensors'\n"
    path = tmp_path / "w.log"
    path.write_bytes(text.encode("cp1252"))
    d = diagnose(iter_events(open_log(path), coalesce_progress=True))
    assert d.error is not None and word in d.error.message


# ---- colour codes --------------------------------------------------------------------------------

BAR_RUN = ("steps:   0%|          | 0/100 [00:00<?, ?it/s]\n"
           "steps:  10%|#         | {10}/100 [00:10<01:30,  1.00it/s, avr_loss=0.1]\n"
           "steps:  20%|##        | {20}/100 [00:20<01:20,  1.00it/s, avr_loss=0.1]\n"
           "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n")


@pytest.mark.parametrize("colour", ["\x1b[1;36m{}\x1b[0m", "\x1b[36m{}\x1b[39m", "[1;36m{}[0m", "\x1b[1m\x1b[36m{}\x1b[0m"])
def test_coloured_bar_counts_read_the_same_with_and_without_events(tmp_path, colour):
    plain = read_bytes(tmp_path, BAR_RUN.replace("{10}", "10").replace("{20}", "20").encode())
    assert plain[2] == 20
    text = BAR_RUN.replace("{10}", colour.format(10)).replace("{20}", colour.format(20)).encode()
    assert read_bytes(tmp_path, text) == plain
    assert read_bytes(tmp_path, text, coalesce=False) == plain


TRACEBACK = 'Traceback (most recent call last):\n  File "/w/x.py", line 1, in <module>\n    main()\nKeyError: 1\n'


@pytest.mark.parametrize("head", [
    "2023-12-15 14:14:13,143 [{WARNING}] (BucketManager) Removed bucket",
    "[2023-10-09 00:29:27,796][{WARNING}][dreambooth.train_dreambooth] - Removed bucket",
    "[2023-07-19 14:47:55,500] [ {WARNING}] - Removed bucket",
    "2024-05-25 13:51:03,724 | {WARNING} | /w/kohya_gui/common_gui.py | Removed bucket",
])
@pytest.mark.parametrize("colour", ["\x1b[33m{}\x1b[0m", "\x1b[1;33m{}\x1b[0m", "[33m{}[0m"])
def test_a_coloured_level_in_a_record_head(tmp_path, head, colour):
    plain = read_bytes(tmp_path, (head.replace("{WARNING}", "WARNING") + "\n" + TRACEBACK).encode())
    coloured = head.replace("{WARNING}", colour.format("WARNING")) + "\n" + TRACEBACK
    assert read_bytes(tmp_path, coloured.encode()) == plain


# ---- Rich's traceback box in ASCII ------------------------------------------------------------------

# What Rich draws instead of its box glyphs on a console that cannot encode them.
ASCII_BOX = str.maketrans({"╭": "+", "╮": "+", "╰": "+", "╯": "+", "─": "-", "│": "|", "❱": ">"})


# Boxes with their title and boxes whose top scrolled away (the paste starts inside the box).
@pytest.mark.parametrize("name", ("034", "076", "081", "1003", "1009", "041", "042", "049", "1173", "125"))
@pytest.mark.parametrize("codec", ["utf-8", "cp1252"])
def test_rich_traceback_box_drawn_in_ascii(tmp_path, name, codec):
    text = original(name)
    assert "│" in text
    data = text.translate(ASCII_BOX).encode(codec, errors="replace")
    assert read_bytes(tmp_path, data) == reading(PUBLIC / f"{name}.log")


def test_an_ascii_table_is_no_traceback_box(tmp_path):
    table = ("+------+-------+\n| step | loss  |\n+------+-------+\n|   12 | 0.1   |\n+------+-------+\n"
             "Traceback (most recent call last):\n" '  File "/w/x.py", line 1, in <module>\n    main()\nKeyError: 1\n')
    assert read_bytes(tmp_path, table.encode())[0] == "error"
