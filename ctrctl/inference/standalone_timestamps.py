"""Timestamp columns -> the features preprocess derives from them, whole columns at once.

Copied into every artifact as ``serving_timestamps.py`` beside ``serving_encoder.py``, which
loads it by file path; numpy and the standard library only. ``hour_of_day`` (0-23), ISO
``weekday`` (1-7, Monday 1) and ``day`` (1-31) come out as polars' ``strptime`` and
``dt`` give them to the preprocess step (``ctrctl.data.transforms.derived_key``):
fixed-width formats (``%Y %y %m %d %H %M %S`` and literal characters) are parsed as byte
columns, two-digit years as chrono reads them (00-69 -> 20xx, 70-99 -> 19xx); other formats
go through Python's ``strptime`` value by value.

Example:
    >>> parts(np.array(["14102100"], dtype=object), np.zeros(1, bool), "%y%m%d%H")
    {'hour_of_day': array([0]), 'weekday': array([2]), 'day': array([21]), 'missing': ...}
"""

import datetime

import numpy as np

_DIRECTIVES = {"%Y": 4, "%y": 2, "%m": 2, "%d": 2, "%H": 2, "%M": 2, "%S": 2}


class StampError(ValueError):
    """A value that is not a timestamp of the format: its row, what was expected, the value."""

    def __init__(self, row, expected, got):
        super().__init__(f"row {row}: expected {expected}, got {got!r}")
        self.row, self.expected, self.got = row, expected, got


def parts(texts, missing, fmt):
    """{hour_of_day, weekday, day, missing} of timestamp texts (missing rows: "")."""
    fields = _packed_fields(fmt)
    if fields is None:
        year, month, day, hour = _strptime_each(texts, missing, fmt)
    else:
        year, month, day, hour = _parse_packed(texts, missing, fmt, fields)
    weekday = (_days_from_civil(year, month, day) + 3) % 7 + 1  # 1970-01-01 was a Thursday
    return {"hour_of_day": hour, "weekday": weekday, "day": day, "missing": missing}


def _packed_fields(fmt):
    """[(directive or literal, offset, width)] of a fixed-width format, None otherwise."""
    fields, at, i = [], 0, 0
    while i < len(fmt):
        if fmt[i] == "%":
            directive = fmt[i:i + 2]
            if directive not in _DIRECTIVES:
                return None
            fields.append((directive, at, _DIRECTIVES[directive]))
            at, i = at + _DIRECTIVES[directive], i + 2
        else:
            fields.append((fmt[i], at, 1))
            at, i = at + 1, i + 1
    return fields


def _parse_packed(texts, missing, fmt, fields):
    width = sum(w for _, _, w in fields)
    expected = f"a timestamp {fmt!r} ({width} characters)"
    try:
        data = texts.astype(f"S{width}") if len(texts) else np.zeros(0, f"S{width}")
        wrong = np.fromiter(map(len, texts), np.int64, count=len(texts)) != width
    except UnicodeEncodeError:
        data, wrong = None, np.ones(len(texts), bool)
    wrong &= ~missing
    if wrong.any():
        at = int(np.flatnonzero(wrong)[0])
        raise StampError(at, expected, texts[at])
    if data is None:  # unreachable: a text that is not ASCII made every row wrong above
        raise StampError(None, expected, None)
    matrix = data.view(np.uint8).reshape(len(texts), width).astype(np.int64)
    value: dict = {"%Y": None, "%y": None, "%m": 1, "%d": 1, "%H": 0, "%M": 0, "%S": 0}
    bad = np.zeros(len(texts), bool)
    for part, offset, size in fields:
        block = matrix[:, offset:offset + size]
        if part in _DIRECTIVES:
            digits = block - ord("0")
            bad |= ((digits < 0) | (digits > 9)).any(1)
            value[part] = (digits * 10 ** np.arange(size - 1, -1, -1)).sum(1)
        else:
            bad |= block[:, 0] != ord(part)
    year: np.ndarray
    if value["%Y"] is not None:
        year = value["%Y"]
    elif value["%y"] is not None:  # as chrono (polars) reads it: 00-69 -> 20xx, 70-99 -> 19xx
        year = np.where(value["%y"] < 70, 2000, 1900) + value["%y"]
    else:
        year = np.full(len(texts), 1970)
    month, day, hour = (np.broadcast_to(np.asarray(value[k]), (len(texts),))
                        for k in ("%m", "%d", "%H"))
    minute, second = (np.broadcast_to(np.asarray(value[k]), (len(texts),))
                      for k in ("%M", "%S"))
    bad |= (month < 1) | (month > 12) | (hour > 23) | (minute > 59) | (second > 60)
    bad |= (day < 1) | (day > _days_in_month(year, np.clip(month, 1, 12)))
    bad &= ~missing
    if bad.any():
        at = int(np.flatnonzero(bad)[0])
        raise StampError(at, expected, texts[at])
    return (np.where(missing, 1970, year), np.where(missing, 1, month),
            np.where(missing, 1, day), np.where(missing, 0, hour))


def _strptime_each(texts, missing, fmt):
    """A format with other directives: Python's strptime, value by value."""
    parts = np.zeros((4, len(texts)), np.int64)
    parts[:, :] = np.array([1970, 1, 1, 0])[:, None]
    for i in np.flatnonzero(~missing):
        try:
            stamp = datetime.datetime.strptime(texts[i], fmt)
        except ValueError:
            raise StampError(int(i), f"a timestamp {fmt!r}", texts[i]) from None
        parts[:, i] = (stamp.year, stamp.month, stamp.day, stamp.hour)
    return parts[0], parts[1], parts[2], parts[3]


def _days_in_month(year, month):
    leap = ((year % 4 == 0) & (year % 100 != 0)) | (year % 400 == 0)
    days = np.array([0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31])[month]
    return days + (leap & (month == 2))


def _days_from_civil(year, month, day):
    """Days since 1970-01-01 of proleptic Gregorian dates (H. Hinnant's algorithm)."""
    y = year - (month <= 2)
    era = np.floor_divide(y, 400)
    yoe = y - era * 400
    doy = (153 * (month + np.where(month > 2, -3, 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468
