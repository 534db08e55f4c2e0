"""Units, parsed in one place.

Memory follows Kubernetes quantities: ``5G`` is 5·10^9 bytes, ``5Gi`` is 5·2^30 bytes, a bare
number is bytes. Two legacy spellings carry an implied unit: the Run:ai ``gpu-memory`` annotation
is MiB and ``aliyun.com/gpu-mem`` is GiB. A GPU portion is a decimal share of one device's memory,
so the same byte amount is a different portion of a 16 GB V100 than of an 80 GB H100.
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal, InvalidOperation

from tessera.core.errors import InvalidRequest

MiB = 2**20
GiB = 2**30

_SUFFIX: dict[str, int] = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_QUANTITY = re.compile(r"^([+]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?\Z")
_QUANTITY_RULE = (
    "must be a Kubernetes quantity such as 5G (5·10^9 bytes), 5Gi (5·2^30 bytes), "
    "2500M or 500000000"
)


# Common spellings beside Kubernetes' own: 5GB = 5G (10^9), 5GiB = 5Gi (2^30), 5KB/5kB = 5k.
_SPELLED = re.compile(r"^(.*[0-9.])\s*(?:([KMGTPE]i)B|([MGTPE])B|[kK]B)$")
_LOWER = re.compile(r"^([+]?[0-9.]+(?:[eE][+-]?[0-9]+)?)\s*([mgtpe](?:i?b)?|[kK]ib|[MGTPE]ib|[kmgtpe]i)$")


MAX_QUANTITY_TEXT = 64
"""Characters of a number or quantity; longer text is refused before any arithmetic."""
MAX_EXPONENT = 30
"""Largest decimal exponent accepted (10^30 bytes is far past any GPU). ``1e999999`` must be
refused, not converted: turning it into an integer took a minute of one CPU."""
_NUMBER = re.compile(r"[+-]?(?:[0-9]*\.?[0-9]+|[0-9]+\.)(?:[eE]([+-]?[0-9]+))?")


def check_number_size(text: str, field: str, value: object) -> None:
    """Refuse a number too long or with too large an exponent before it is computed with."""
    if len(text) > MAX_QUANTITY_TEXT:
        raise InvalidRequest(field, f"must be at most {MAX_QUANTITY_TEXT} characters",
                             f"{text[:20]}… ({len(text)} characters)")
    m = _NUMBER.match(text)
    if m is None:
        return
    exp_text = m.group(1)
    mantissa = text[: m.start(1) - 1] if exp_text else text[: m.end()]
    exponent = 0 if not exp_text else int(exp_text) if len(exp_text) <= 6 else 10**6
    whole = mantissa.lstrip("+-").split(".")[0].lstrip("0")
    if abs(exponent) > MAX_EXPONENT or len(whole) + exponent > MAX_EXPONENT:
        raise InvalidRequest(field, f"is out of range: numbers below 10^{MAX_EXPONENT}, "
                             f"exponents within ±{MAX_EXPONENT}", value)


def _respell(text: str) -> str:
    m = _SPELLED.match(text)
    if m is None:
        return text
    return m.group(1) + (m.group(2) or m.group(3) or "k")


def _lowercase_hint(text: str, field: str, value: object) -> None:
    m = _LOWER.match(text)
    if m is not None:
        n, letter = m.group(1), m.group(2)[0].upper()
        raise InvalidRequest(
            field, f"unit {m.group(2)!r} is ambiguous: write {n}{letter} or {n}{letter}B "
            f"(decimal) or {n}{letter}i or {n}{letter}iB (binary)", value)


def parse_memory(value: object, field: str) -> int:
    """Bytes of a Kubernetes memory quantity; must be positive. Fractions of a byte round up.
    ``5GB``/``5GiB`` are read as ``5G``/``5Gi``; a lowercase unit (``5g``) is refused with a hint."""
    if isinstance(value, bool):
        raise InvalidRequest(field, _QUANTITY_RULE, value)
    if isinstance(value, int):
        if abs(value) > 10**MAX_EXPONENT:
            raise InvalidRequest(field, f"is out of range: numbers up to 10^{MAX_EXPONENT}",
                                 "a number of more than 30 digits")
        amount = Decimal(value)
    else:
        text = _respell(str(value).strip())
        check_number_size(text, field, value)
        _lowercase_hint(text, field, value)
        match = _QUANTITY.match(text)
        if match is None:
            raise InvalidRequest(field, _QUANTITY_RULE, value)
        try:
            amount = Decimal(match.group(1)) * _SUFFIX[match.group(2) or ""]
        except InvalidOperation as exc:
            raise InvalidRequest(field, _QUANTITY_RULE, value) from exc
    nbytes = int(amount.to_integral_value(rounding=ROUND_CEILING))
    if nbytes <= 0:
        raise InvalidRequest(field, "must be greater than 0 bytes", value)
    return nbytes


def parse_gpu_memory(value: object, field: str) -> int:
    """GPU memory typed by a user (CLI flag, API field): a quantity with a unit. A bare number
    is refused: it means bytes to Kubernetes and MiB to Run:ai's gpu-memory annotation, and
    5000 bytes is never what anyone means by GPU memory (docs/units.md)."""
    text = str(value).strip()
    if not isinstance(value, bool) and re.fullmatch(r"[+]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?", text):
        raise InvalidRequest(
            field, f"needs a unit: {text}Mi (MiB, as Run:ai's gpu-memory annotation reads a bare "
            "number), or 5G / 5GB (10^9 bytes), 5Gi / 5GiB (2^30 bytes)", value)
    return parse_memory(value, field)


def _positive_int(value: object, field: str, unit: str) -> int:
    text = str(value).strip()
    if len(text) > 15:
        raise InvalidRequest(field, f"must be a positive whole number of {unit} of at most 15 "
                             "digits", f"{text[:20]}… ({len(text)} characters)")
    if isinstance(value, bool) or not re.fullmatch(r"[0-9]+", text) or int(text) <= 0:
        raise InvalidRequest(field, f"must be a positive whole number of {unit}, with no suffix", value)
    return int(text)


def parse_runai_gpu_memory(value: object, field: str = "gpu-memory") -> int:
    """Bytes of the Run:ai ``gpu-memory`` annotation, whose value is MiB."""
    return _positive_int(value, field, "MiB") * MiB


def parse_aliyun_gpu_mem(value: object, field: str = "aliyun.com/gpu-mem") -> int:
    """Bytes of Alibaba cGPU's ``aliyun.com/gpu-mem`` resource, whose value is GiB."""
    return _positive_int(value, field, "GiB") * GiB


def parse_decimal(value: object, field: str, rule: str) -> Decimal:
    if isinstance(value, bool):
        raise InvalidRequest(field, rule, value)
    check_number_size(str(value).strip(), field, value)
    try:
        number = Decimal(str(value).strip())
    except InvalidOperation as exc:
        raise InvalidRequest(field, rule, value) from exc
    if not number.is_finite():
        raise InvalidRequest(field, rule, value)
    return number


def parse_portion(value: object, field: str, *, allow_whole: bool = False) -> Decimal:
    """A share of one GPU: a decimal in (0, 1), or (0, 1] where ``allow_whole`` (burst limits)."""
    upper = "1]" if allow_whole else "1)"
    rule = f"must be a decimal GPU portion in (0, {upper}, such as 0.5"
    portion = parse_decimal(value, field, rule)
    too_big = portion > 1 if allow_whole else portion >= 1
    if portion <= 0 or too_big:
        raise InvalidRequest(field, rule, value)
    portion = portion.normalize()  # 0.5000 is 0.5: trailing zeros are no extra precision
    if portion.as_tuple().exponent < -3:  # type: ignore[operator]
        raise InvalidRequest(field, "must have at most 3 decimal places (a thousandth of a GPU)", value)
    return portion


def portion_bytes(portion: Decimal, device_memory: int) -> int:
    """Bytes a portion takes on a device, rounded down so shares summing to 1 never overflow it."""
    return int(portion * device_memory)


_BINARY = (("EiB", 2**60), ("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20),
           ("KiB", 2**10))


def format_bytes(nbytes: int | float) -> str:
    """Human size in binary units, as ``nvidia-smi`` shows GPU memory: a 16 GB V100 is
    ``16 GiB``, half of it ``8 GiB``, ``5G`` is ``4.7 GiB``, ``2Gi`` is ``2 GiB``."""
    for unit, size in _BINARY:
        if abs(nbytes) >= size:
            v = nbytes / size
            if abs(v) >= 10_000:
                return f"{v:.3g} {unit}"
            text = f"{v:.0f}" if abs(v) >= 100 else f"{v:.1f}".removesuffix(".0")
            return f"{text} {unit}"
    return f"{int(nbytes)} B"


_DECIMAL = (("E", 10**18), ("P", 10**15), ("T", 10**12), ("G", 10**9), ("M", 10**6), ("k", 10**3))


def _binary3(nbytes: int) -> str:
    """Binary size to three significant digits: ``4.66 GiB``, ``65.2 GiB``, ``477 MiB``."""
    for unit, size in _BINARY:
        if nbytes >= size:
            return f"{nbytes / size:.3g} {unit}"
    return f"{nbytes} B"


def memory_text(nbytes: int) -> str:
    """GPU memory as the user typed it, next to its binary size where the two differ.

    The unit typed is read back from the amount: a whole number of a decimal unit that is not
    also a whole number of MiB was typed in decimal (``5G`` -> "5G (4.66 GiB)", ``500M`` ->
    "500M (477 MiB)"); a whole number of a binary unit reads as that ("2 GiB", "5000 MiB (4.88
    GiB)"); any other amount is its binary size (as :func:`format_bytes`)."""
    if nbytes <= 0:
        return format_bytes(nbytes)
    for unit, size in _BINARY[:-1]:  # MiB and up: a KiB multiple may be a decimal k
        if nbytes % size == 0:
            exact, short = f"{nbytes // size} {unit}", _binary3(nbytes)
            return exact if short == exact else f"{exact} ({short})"
    for unit, size in _DECIMAL:
        if nbytes % size == 0:
            return f"{nbytes // size}{unit} ({_binary3(nbytes)})"
    return format_bytes(nbytes)


def format_gpus(gpus: float) -> str:
    """GPU count as users read it: ``1``, ``0.5``, ``2.25``."""
    text = f"{gpus:.2f}".rstrip("0").rstrip(".")
    return text or "0"
