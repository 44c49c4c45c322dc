"""stderr's lines: every one with its time (UTC) and level, as text or as one JSON object.

Text: "2026-12-06T07:30:00.123Z WARNING cnpa-op: TeamSpace a: MESSAGE"; each line of a
multi-line message (a traceback) carries the prefix too, so that a grep of the journal finds it.
JSON: {"time", "level", "logger", "msg"} and "teamspace" when the line is about one (a record
logged with extra={"teamspace": NAME}).

stdout has one line per write that went through (write_line): "teamspace NAME: WHAT" in text
mode, as a pass has always printed it; in JSON mode one JSON object too, of the same fields
(logger cnpa_controller.write, msg the text line), so that a log pipeline reading the journal
(where stdout and stderr meet) parses every line of the unit.
"""

from __future__ import annotations

import json
import logging
import sys
import time

FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warning", "error")


def utc(record: logging.LogRecord) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + \
        f".{int(record.msecs):03d}Z"


def message(record: logging.LogRecord) -> str:
    text = record.getMessage()
    if record.exc_info:
        text += "\n" + logging.Formatter().formatException(record.exc_info)
    return text


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        prefix = f"{utc(record)} {record.levelname} cnpa-op: "
        return "\n".join(prefix + line for line in message(record).split("\n"))


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {"time": utc(record), "level": record.levelname.lower(), "logger": record.name,
                "msg": message(record)}
        teamspace = getattr(record, "teamspace", None)
        if teamspace:
            line["teamspace"] = teamspace
        return json.dumps(line, ensure_ascii=False)


class Handler(logging.StreamHandler):
    """(A class of its own so that setup() finds the one it added.)"""


_format = "text"   # setup()'s: write_line's too


def write_line(teamspace: str, what: str) -> str:
    """stdout's line for one write that went through (see the module's docstring)."""
    text = f"teamspace {teamspace}: {what}"
    if _format != "json":
        return text
    now = time.time()
    return json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now))
                       + f".{int(now % 1 * 1000):03d}Z", "level": "info",
                       "logger": "cnpa_controller.write", "msg": text, "teamspace": teamspace},
                      ensure_ascii=False)


def setup(fmt: str = "text", level: str = "info", stream=None) -> None:
    """Our loggers at `level`; any library's at warning or above, through the same handler so
    that their lines have a time and level too."""
    global _format
    _format = fmt
    handler = Handler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    # main() may run more than once in one interpreter (tests): one handler, the last one set up.
    for old in [h for h in root.handlers if isinstance(h, Handler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    wanted = getattr(logging, level.upper())
    root.setLevel(max(logging.WARNING, wanted))
    logging.getLogger("cnpa_controller").setLevel(wanted)


def about(name: str) -> dict:
    """extra= of a record about one TeamSpace: its "teamspace" field in JSON."""
    return {"teamspace": name}
