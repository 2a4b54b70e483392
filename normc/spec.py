"""The normc spec language: which normalization a kernel computes.

A spec names the input's *logical* axes in the order of its shape, the statistic, the reduction axes
(the axes the mean/variance or mean square is taken over), and optional affine steps. Every axis that
is not reduced is a *kept axis*: one statistic is computed per index of the kept axes.

Grammar (whitespace-insensitive; tokens are identifiers ``[A-Za-z_][A-Za-z0-9_]*``, ``(``, ``)``,
``:`` and ``;``)::

    spec  := dims ':' stat 'over' axis+ (';' step)* [';']
    dims  := (name | '(' name name+ ')')+      # a split dim has >= 2 parts; no nesting
    stat  := 'norm' | 'rms'
    step  := ('scale' | 'shift') axis+

``norm`` is ``y = (x - mean) * rsqrt(var + eps)``, ``rms`` is ``y = x * rsqrt(mean(x**2) + eps)``, both
taken over the reduction axes. ``scale`` multiplies by a parameter indexed by its axes and ``shift`` adds
one (``y = normalized * scale + shift``); at most one of each, scale before shift. The keywords
``norm rms over scale shift`` cannot be axis names. Every axis may be reduced (e.g. ``t d : norm over t d``).

A parenthesised dim ``(g k)`` splits one dimension of the input into parts (row-major, ``g`` outermost);
the extent of all but at most one part is given as a keyword size, the last is inferred from the shape.

Examples::

    spec("t d : norm over d ; scale d ; shift d")                             # layer norm
    spec("t d : rms over d ; scale d", eps=1e-6)                              # RMS norm
    spec("n c h w : norm over h w ; scale c ; shift c")                       # instance norm
    spec("n (g k) h w : norm over k h w ; scale g k ; shift g k", g=32)       # group norm
    spec("n c h w : norm over n h w ; scale c ; shift c")                     # batch-norm statistics

Specs are immutable and hashable; equal specs (same meaning, whatever the spacing or the order in which
reduction/scale/shift axes were listed) compare equal and have the same canonical :attr:`Spec.text`.

Errors: anything wrong with a spec raises :class:`normc.errors.SpecError` (with the text and the
offending position where there is one); a shape that does not fit a spec raises
:class:`normc.errors.ArgumentError`.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .errors import ArgumentError, SpecError, check_flag

__all__ = [
    "Spec",
    "spec",
    "layer_norm",
    "rms_norm",
    "instance_norm",
    "group_norm",
    "batch_norm_stats",
    "KEYWORDS",
    "STATS",
]

STATS = ("norm", "rms")
STEPS = ("scale", "shift")
KEYWORDS = frozenset(("norm", "rms", "over", "scale", "shift"))

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_NAME_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_NAME_CHARS = _NAME_START | frozenset("0123456789")
_PUNCT = frozenset("():;")
_SPACE = frozenset(" \t\n\r\f\v")
_EXAMPLE = "'n c h w : norm over h w ; scale c ; shift c'"


# ----------------------------------------------------------------------------------------------------
# Lexing and parsing


class _Tok(NamedTuple):
    kind: str  # 'name', '(', ')', ':', ';' or 'end'
    value: str
    pos: int


class _Parsed(NamedTuple):
    dims: tuple  # tuple of tuples of names
    dim_pos: tuple  # text offset of each dim (its name, or its '(')
    part_pos: dict  # axis name -> text offset in the dims
    stat: str
    reduced: tuple  # canonical (axes) order
    scale: tuple | None
    shift: tuple | None


def _describe(tok: _Tok) -> str:
    return "end of text" if tok.kind == "end" else repr(tok.value)


def _tokenize(text: str) -> list[_Tok]:
    toks = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in _SPACE:
            i += 1
        elif c in _PUNCT:
            toks.append(_Tok(c, c, i))
            i += 1
        elif c in _NAME_START:
            j = i + 1
            while j < n and text[j] in _NAME_CHARS:
                j += 1
            toks.append(_Tok("name", text[i:j], i))
            i = j
        else:
            hint = "; axis names start with a letter or '_'" if c.isdigit() else ""
            raise SpecError(
                f"unknown character {c!r} in spec; expected axis names, '(', ')', ':' or ';'{hint}", text, i
            )
    toks.append(_Tok("end", "", n))
    return toks


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.toks = _tokenize(text)
        self.i = 0

    def peek(self) -> _Tok:
        return self.toks[self.i]

    def advance(self) -> _Tok:
        tok = self.toks[self.i]
        if tok.kind != "end":
            self.i += 1
        return tok

    def fail(self, message: str, pos: int):
        raise SpecError(message, self.text, pos)

    def parse(self) -> _Parsed:
        if self.peek().kind == "end":
            self.fail(f"empty spec; expected dims, ':', a statistic and reduction axes, e.g. {_EXAMPLE}", 0)
        dims, dim_pos, part_pos = self.parse_dims()
        axes = tuple(a for d in dims for a in d)
        stat = self.parse_stat()
        reduced = self.parse_axes("reduction", axes, f"nothing reduced: expected reduction axes after 'over', e.g. '{stat} over {axes[-1]}'")
        scale = shift = None
        while self.peek().kind == ";":
            self.advance()
            tok = self.peek()
            if tok.kind == "end":
                break  # a trailing ';'
            if tok.kind == "name" and tok.value in STEPS:
                if tok.value == "scale":
                    if scale is not None:
                        self.fail("repeated 'scale' step; a spec has at most one scale step", tok.pos)
                    if shift is not None:
                        self.fail("'scale' step after 'shift'; scale must come before shift (y = normalized*scale + shift)", tok.pos)
                elif shift is not None:
                    self.fail("repeated 'shift' step; a spec has at most one shift step", tok.pos)
                self.advance()
                names = self.parse_axes(tok.value, axes, f"'{tok.value}' step has no axes; expected e.g. '{tok.value} {axes[-1]}'")
                if tok.value == "scale":
                    scale = names
                else:
                    shift = names
            elif tok.kind == ";":
                self.fail("empty step between ';'; expected 'scale' or 'shift'", tok.pos)
            elif tok.kind == "name":
                self.fail(f"unknown step {tok.value!r}; expected 'scale' or 'shift'", tok.pos)
            else:
                self.fail(f"expected a step ('scale' or 'shift') after ';', got {_describe(tok)}", tok.pos)
        tok = self.peek()
        if tok.kind != "end":  # parse_axes stops only at ';' or the end, so this is defensive
            self.fail(f"unexpected {_describe(tok)}; expected ';' or the end of the spec", tok.pos)
        return _Parsed(dims, tuple(dim_pos), part_pos, stat, reduced, scale, shift)

    def check_name(self, tok: _Tok, part_pos: dict, what: str):
        if tok.value in KEYWORDS:
            self.fail(f"{tok.value!r} is a keyword and cannot be an axis name", tok.pos)
        if tok.value in part_pos:
            self.fail(f"{what} {tok.value!r} repeated in the dims; every axis name must be unique", tok.pos)
        part_pos[tok.value] = tok.pos

    def parse_dims(self):
        has_colon = any(t.kind == ":" for t in self.toks)
        dims, dim_pos, part_pos = [], [], {}
        while True:
            tok = self.peek()
            if tok.kind == ":":
                if not dims:
                    self.fail("no dims before ':'; expected the input's axis names in shape order, e.g. 'n c h w :'", tok.pos)
                self.advance()
                return tuple(dims), dim_pos, part_pos
            if tok.kind == "end":
                self.fail(f"missing ':' after the dims; expected e.g. {_EXAMPLE}", tok.pos)
            if tok.kind == "name":
                if tok.value in STATS and not has_colon:
                    self.fail(f"missing ':' between the dims and the statistic {tok.value!r}", tok.pos)
                self.check_name(tok, part_pos, "axis")
                self.advance()
                dims.append((tok.value,))
                dim_pos.append(tok.pos)
            elif tok.kind == "(":
                opened = self.advance()
                parts = []
                while True:
                    tok = self.peek()
                    if tok.kind == "name":
                        self.check_name(tok, part_pos, "axis")
                        if tok.value == "eps":  # its size would be the keyword eps=, which is the epsilon
                            self.fail("'eps' cannot name a part of a split dim: a part is sized by a keyword of "
                                      "its name, and eps= is the epsilon; rename the part", tok.pos)
                        parts.append(tok.value)
                        self.advance()
                    elif tok.kind == ")":
                        self.advance()
                        break
                    elif tok.kind == "(":
                        self.fail("nested '(': a split dim's parts must be plain axis names", tok.pos)
                    else:
                        self.fail("unclosed '(': expected ')' after the parts of the split dim", opened.pos)
                if len(parts) < 2:
                    self.fail(f"a split dim needs at least 2 parts inside '( )', got {len(parts)}", opened.pos)
                dims.append(tuple(parts))
                dim_pos.append(opened.pos)
            elif tok.kind == ")":
                self.fail("unmatched ')' in the dims", tok.pos)
            else:  # ';'
                self.fail("unexpected ';' in the dims; expected ':' after the dims", tok.pos)

    def parse_stat(self) -> str:
        tok = self.peek()
        if tok.kind == "name" and tok.value in STATS:
            stat = tok.value
            self.advance()
        elif tok.kind == "name" and tok.value not in KEYWORDS:
            self.fail(f"unknown statistic {tok.value!r}; expected 'norm' or 'rms'", tok.pos)
        else:
            self.fail(f"missing statistic after ':', got {_describe(tok)}; expected 'norm' or 'rms'", tok.pos)
        tok = self.peek()
        if tok.kind == "name" and tok.value == "over":
            self.advance()
        else:
            self.fail(f"missing 'over' after {stat!r}, got {_describe(tok)}; expected '{stat} over <reduction axes>'", tok.pos)
        return stat

    def parse_axes(self, role: str, axes: tuple, empty_message: str) -> tuple:
        names = []
        while self.peek().kind == "name":
            tok = self.advance()
            if tok.value in KEYWORDS:
                self.fail(f"{tok.value!r} is a keyword, not a {role} axis; separate steps with ';'", tok.pos)
            if tok.value not in axes:
                self.fail(f"unknown {role} axis {tok.value!r}: not an axis of the input ({', '.join(axes)})", tok.pos)
            if tok.value in names:
                self.fail(f"{role} axis {tok.value!r} repeated", tok.pos)
            names.append(tok.value)
        tok = self.peek()
        if tok.kind == "(":
            self.fail(f"parentheses group parts of a dim only before ':'; name the {role} axes one by one "
                      f"(e.g. 'g k' for a dim (g k))", tok.pos)
        if not names:
            self.fail(empty_message, tok.pos)
        if tok.kind not in (";", "end"):
            self.fail(f"unexpected {_describe(tok)} after the {role} axes; expected an axis name or ';'", tok.pos)
        return tuple(sorted(names, key=axes.index))


# ----------------------------------------------------------------------------------------------------
# Validation shared by spec() and Spec(...)


def _check_sizes(parsed: _Parsed, sizes, text: str) -> tuple:
    """Validate keyword part sizes against the parsed dims; return them sorted by axis name."""
    if isinstance(sizes, Mapping):
        items = list(sizes.items())
    else:
        if not isinstance(sizes, (tuple, list)) or not all(
            isinstance(item, (tuple, list)) and len(item) == 2 for item in sizes
        ):
            raise SpecError(f"sizes must be a mapping or pairs of (part name, size), got {sizes!r}", text)
        items = [tuple(item) for item in sizes]
    part_of = {p: d for d in parsed.dims if len(d) > 1 for p in d}
    axes = {a for d in parsed.dims for a in d}
    out = {}
    for name, size in items:
        if not isinstance(name, str):
            raise SpecError(f"size names must be str, got {name!r}", text)
        if name in out:
            raise SpecError(f"size {name}= given twice", text)
        if name not in part_of:
            if name in axes:
                msg = (f"size {name}={size!r} given, but {name!r} is not a part of a split dim; "
                       f"only parts of a split such as '(g k)' take a keyword size")
            else:
                msg = f"size {name}={size!r} given, but {name!r} is not an axis of the spec"
            raise SpecError(msg, text, None)
        if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size <= 0:
            raise SpecError(f"size {name}={size!r} must be a positive int", text, parsed.part_pos.get(name))
        out[name] = int(size)
    for d, pos in zip(parsed.dims, parsed.dim_pos):
        if len(d) < 2:
            continue
        missing = [p for p in d if p not in out]
        if len(missing) > 1:
            raise SpecError(
                f"split dim ({' '.join(d)}) has no size for {', '.join(missing)}: give the size of all but one "
                f"of {', '.join(d)} as a keyword, e.g. {missing[0]}=32 (on normc's command line: --size {missing[0]}=32)",
                text,
                pos,
            )
    return tuple(sorted(out.items()))


_FLOAT32_TINIEST = float(np.finfo(np.float32).smallest_subnormal)  # 1.4e-45
# The largest eps: the kernels form variance + eps (rms: mean square + eps) in float32, and a finite variance
# (at most float32's largest value, 2**128 - 2**104) plus an eps below 2**103 (about 1.01e31) cannot round to
# inf (the sum stays under the halfway point 2**128 - 2**103). A larger eps, up to float32's largest value, was
# accepted before 2026-12-07: a float32 variance of 1.44e38 plus eps = 3e38 overflowed, so rstd was 0 and y was
# 0 (norm and rms) where float64 gives +-0.57 (a break test). 1e30 is a round bound below 2**103.
EPS_MAX = 1e30
_EPS_MAX_F32 = float(np.float32(EPS_MAX))  # 1.0000000150e30: what the kernels add for eps = 1e30, also allowed


def _check_eps(eps) -> float:
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise SpecError(f"eps must be a real number, got {type(eps).__name__} {eps!r}")
    try:
        value = float(eps)
    except (TypeError, ValueError, OverflowError):
        raise SpecError(f"eps must be a finite non-negative real number, got {eps!r}") from None
    if math.isnan(value) or math.isinf(value) or value < 0:
        raise SpecError(f"eps must be a finite non-negative real number, got {eps!r}")
    # the kernels add eps in float32, where an eps that rounds to 0 gives a constant row rstd = inf, y = NaN
    if 0 < value <= _FLOAT32_TINIEST / 2:  # rounds to 0 (half of the tiniest: to even, 0)
        raise SpecError(f"eps {eps!r} rounds to 0 in float32; use 0 or at least {_FLOAT32_TINIEST:.2g}")
    # plain float arithmetic, no numpy: torch.compile traces this (normc.torch modules build specs in forward)
    if value > _EPS_MAX_F32:  # compared as float32, the kernels' eps: np.float32(1e30) is 1e30 there
        raise SpecError(f"eps {eps!r} is too large: expected at most {EPS_MAX:g} (the kernels add eps to the "
                        f"variance in float32, where a larger eps can overflow to inf)")
    return value


def _as_names(value, field: str) -> tuple:
    if not isinstance(value, (tuple, list)) or not all(isinstance(a, str) and _NAME_RE.match(a) for a in value):
        raise SpecError(f"Spec.{field} must be a tuple of axis names (identifiers), got {value!r}")
    return tuple(value)


def _as_dims(value) -> tuple:
    if not isinstance(value, (tuple, list)):
        raise SpecError(f"Spec.dims must be a tuple of dims (tuples of axis names), got {value!r}")
    dims = []
    for d in value:
        if isinstance(d, str):
            d = (d,)
        d = _as_names(d, "dims")
        if not d:
            raise SpecError(f"Spec.dims has an empty dim: {value!r}")
        dims.append(d)
    return tuple(dims)


def _render(dims, stat, reduced, scale, shift) -> str:
    parts = [" ".join(d[0] if len(d) == 1 else f"({' '.join(d)})" for d in dims), " : ", stat, " over"]
    if reduced:
        parts.append(" " + " ".join(reduced))
    for step, names in (("scale", scale), ("shift", shift)):
        if names is not None:
            parts.append(f" ; {step}" + "".join(" " + a for a in names))
    return "".join(parts)


# ----------------------------------------------------------------------------------------------------
# Spec


@dataclass(frozen=True, repr=False)
class Spec:
    """A parsed, validated normalization spec (immutable, hashable).

    Build one with :func:`spec` or a family constructor (:func:`layer_norm`, ...); building it directly
    validates the same way and canonicalizes the fields (lists become tuples, axis lists are sorted into
    :attr:`axes` order, ``sizes`` may be a dict).

    Attributes:
        dims: the input's logical dims in shape order; a split dim is a tuple of >= 2 part names, any
            other dim a 1-tuple, e.g. ``(('n',), ('g', 'k'), ('h',), ('w',))``.
        stat: ``'norm'`` (subtract mean, divide by sqrt(var + eps)) or ``'rms'`` (divide by
            sqrt(mean(x**2) + eps)).
        reduced: the reduction axes, in :attr:`axes` order (non-empty; may be every axis).
        scale: the axes the scale parameter is indexed by, in :attr:`axes` order, or ``None`` (no scale).
        shift: the axes the shift parameter is indexed by, in :attr:`axes` order, or ``None`` (no shift).
        eps: the epsilon added to the variance / mean square (>= 0, at most 1e30 (:data:`EPS_MAX`); a
            positive eps must not round to 0 in float32).
        sizes: keyword sizes of split-dim parts as ``(name, size)`` pairs sorted by name.

    Raises:
        SpecError: any field is invalid (unknown or repeated axes, a keyword as an axis name, a split dim
            with fewer than 2 parts or with 2+ parts lacking a size, a size that is not a positive int or
            names no part of a split, a bad eps (one that rounds to 0 in float32 or is above 1e30 too), ...).
    """

    dims: tuple
    stat: str
    reduced: tuple
    scale: tuple | None = None
    shift: tuple | None = None
    eps: float = 1e-5
    sizes: tuple = ()

    def __post_init__(self):
        dims = _as_dims(self.dims)
        if not isinstance(self.stat, str) or self.stat not in STATS:
            raise SpecError(f"Spec.stat must be 'norm' or 'rms', got {self.stat!r}")
        reduced = _as_names(self.reduced, "reduced")
        scale = None if self.scale is None else _as_names(self.scale, "scale")
        shift = None if self.shift is None else _as_names(self.shift, "shift")
        text = _render(dims, self.stat, reduced, scale, shift)
        parsed = _Parser(text).parse()
        sizes = _check_sizes(parsed, self.sizes, text)
        eps = _check_eps(self.eps)
        for name, value in (("dims", parsed.dims), ("reduced", parsed.reduced), ("scale", parsed.scale),
                            ("shift", parsed.shift), ("eps", eps), ("sizes", sizes)):
            object.__setattr__(self, name, value)

    @property
    def axes(self) -> tuple[str, ...]:
        """All axis names (split parts flattened), in shape order."""
        return tuple(a for d in self.dims for a in d)

    @property
    def kept(self) -> tuple[str, ...]:
        """The kept axes (those not reduced), in :attr:`axes` order; one statistic per index of these."""
        return tuple(a for a in self.axes if a not in self.reduced)

    @property
    def ndim(self) -> int:
        """The number of logical dims of the input (its rank), i.e. ``len(dims)``."""
        return len(self.dims)

    @property
    def text(self) -> str:
        """Canonical text, e.g. ``'n (g k) h w : norm over k h w ; scale g k ; shift g k'``."""
        return _render(self.dims, self.stat, self.reduced, self.scale, self.shift)

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        extra = "".join(f", {name}={size}" for name, size in self.sizes)
        return f"normc.spec({self.text!r}, eps={self.eps!r}{extra})"

    def _dims_text(self) -> str:
        return ", ".join(d[0] if len(d) == 1 else f"({' '.join(d)})" for d in self.dims)

    def axis_sizes(self, shape, *, symbolic=False) -> dict[str, int]:
        """Resolve every axis' extent from the input's logical shape.

        Args:
            shape: the input ``x``'s shape, a sequence of :attr:`ndim` non-negative ints (one per dim).
            symbolic: the extents may be symbolic sizes (torch's SymInt, in the fake implementations of
                ``normc.torch``'s custom ops under ``torch.compile`` with dynamic shapes): they are used as given,
                without the int and divisibility checks (the real call makes them).

        Returns:
            ``{axis: extent}`` for every axis in :attr:`axes` order. A split dim's free part (the one with
            no keyword size) is ``extent // product(given sizes)``; it is 0 for a zero-size dim.

        Raises:
            ArgumentError: ``shape`` is not a sequence of non-negative ints, its length is not
                :attr:`ndim`, or a split dim's extent does not fit the keyword sizes of its parts.
        """
        if isinstance(shape, (str, bytes)) or not hasattr(shape, "__len__") or not hasattr(shape, "__iter__"):
            raise ArgumentError(f"x shape must be a sequence of non-negative ints, got {shape!r}")
        shape = list(shape)
        for e in shape if not symbolic else ():
            if isinstance(e, bool) or not isinstance(e, numbers.Integral) or e < 0:
                raise ArgumentError(f"x shape must be a sequence of non-negative ints, got {tuple(shape)!r}")
        if len(shape) != self.ndim:
            raise ArgumentError(
                f"x has rank {len(shape)} but spec {self.text!r} has {self.ndim} dims ({self._dims_text()})"
            )
        given = dict(self.sizes)
        out = {}
        for i, (d, extent) in enumerate(zip(self.dims, shape)):
            extent = extent if symbolic else int(extent)
            if len(d) == 1:
                out[d[0]] = extent
                continue
            known = [p for p in d if p in given]
            product = math.prod(given[p] for p in known)
            free = [p for p in d if p not in given]
            label = f"x dim {i} ({' '.join(d)}) has extent {extent}"
            if free:
                if not symbolic and extent % product:
                    by = "*".join(f"{p}={given[p]}" for p in known)
                    if len(known) > 1:
                        by += f" (= {product})"
                    raise ArgumentError(f"{label}, not divisible by {by}")
                sizes = {p: given.get(p, extent // product) for p in d}
            else:
                if not symbolic and product != extent:
                    raise ArgumentError(
                        f"{label}, but {'*'.join(f'{p}={given[p]}' for p in d)} = {product}"
                    )
                sizes = {p: given[p] for p in d}
            out.update(sizes)
        return {a: out[a] for a in self.axes}


def spec(text, /, *, eps: float = 1e-5, **sizes: int) -> Spec:
    """Parse a spec's text into a :class:`Spec`.

    Args:
        text: the spec, e.g. ``'n (g k) h w : norm over k h w ; scale g k ; shift g k'`` (grammar in the
            module docstring).
        eps: epsilon added to the variance (``norm``) or mean square (``rms``); >= 0 and at most 1e30
            (:data:`EPS_MAX`: the sum is formed in float32); a positive eps must not round to 0 in float32 (above
            7.0e-46).
        **sizes: the extent of parts of split dims, e.g. ``g=32``; every split dim needs all but at most
            one of its parts given. (A part cannot be named ``eps``.)

    Returns:
        The validated, canonical :class:`Spec`.

    Raises:
        SpecError: the text is not a str or is malformed (``err.text``/``err.pos`` locate the problem), a
            size is missing, not a positive int, or names no part of a split, or eps is invalid (or rounds to
            0 or to inf in float32).
    """
    if not isinstance(text, str):
        raise SpecError(f"spec text must be a str, got {type(text).__name__} {text!r}")
    parsed = _Parser(text).parse()
    size_items = _check_sizes(parsed, sizes, text)
    eps = _check_eps(eps)
    return Spec(parsed.dims, parsed.stat, parsed.reduced, parsed.scale, parsed.shift, eps, size_items)


# ----------------------------------------------------------------------------------------------------
# Families


def _check_int(value, name: str, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low or (
        high is not None and value > high
    ):
        bound = f">= {low}" if high is None else f"in {low}..{high}"
        raise SpecError(f"{name} must be an int {bound}, got {value!r}")
    return int(value)


_SPATIAL = {0: (), 1: ("l",), 2: ("h", "w"), 3: ("d", "h", "w")}


def _last_axes_spec(stat, ndim, normalized_ndim, eps, scale, shift) -> Spec:
    ndim = _check_int(ndim, "ndim", 1)
    normalized_ndim = _check_int(normalized_ndim, "normalized_ndim", 1, ndim)
    if (ndim, normalized_ndim) == (2, 1):
        kept, reduced = ("t",), ("d",)
    else:
        kept = tuple(f"a{i}" for i in range(ndim - normalized_ndim))
        reduced = tuple(f"d{i}" for i in range(normalized_ndim))
    return Spec(tuple((a,) for a in kept + reduced), stat, reduced,
                reduced if scale else None, reduced if shift else None, eps)


def layer_norm(ndim: int = 2, normalized_ndim: int = 1, *, eps=1e-5, elementwise_affine=True, bias=True) -> Spec:
    """Layer norm over the last ``normalized_ndim`` of ``ndim`` dims (like ``torch.nn.LayerNorm``).

    Kept axes are named ``a0 a1 ...`` and reduction axes ``d0 d1 ...``, except that the default
    ``ndim=2, normalized_ndim=1`` gives ``'t d : norm over d ; scale d ; shift d'``.

    Args:
        ndim: the input's rank (>= 1).
        normalized_ndim: how many trailing dims are reduced (1..ndim).
        eps: epsilon added to the variance.
        elementwise_affine: scale (and shift, if ``bias``) over the reduction axes.
        bias: include the shift step (only with ``elementwise_affine``).

    Raises:
        SpecError: ``ndim``/``normalized_ndim`` out of range, ``eps`` invalid, or a flag not a bool.
    """
    elementwise_affine = check_flag(elementwise_affine, "elementwise_affine", SpecError)
    bias = check_flag(bias, "bias", SpecError)
    return _last_axes_spec("norm", ndim, normalized_ndim, eps, elementwise_affine, elementwise_affine and bias)


def rms_norm(ndim: int = 2, normalized_ndim: int = 1, *, eps=1e-6, elementwise_affine=True) -> Spec:
    """RMS norm over the last ``normalized_ndim`` of ``ndim`` dims: ``y = x * rsqrt(mean(x**2) + eps) * scale``.

    Axis names as in :func:`layer_norm`; the default is ``'t d : rms over d ; scale d'``.

    Args:
        ndim: the input's rank (>= 1).
        normalized_ndim: how many trailing dims are reduced (1..ndim).
        eps: epsilon added to the mean square.
        elementwise_affine: include the scale step over the reduction axes.

    Raises:
        SpecError: ``ndim``/``normalized_ndim`` out of range, ``eps`` invalid, or a flag not a bool.
    """
    elementwise_affine = check_flag(elementwise_affine, "elementwise_affine", SpecError)
    return _last_axes_spec("rms", ndim, normalized_ndim, eps, elementwise_affine, False)


def _channel_spec(dims, reduced, param, eps, affine, sizes=()) -> Spec:
    affine = check_flag(affine, "affine", SpecError)
    return Spec(dims, "norm", reduced, param if affine else None, param if affine else None, eps, sizes)


def instance_norm(spatial_dims: int = 2, *, eps=1e-5, affine=True) -> Spec:
    """Instance norm of an ``(n, c, *spatial)`` input: statistics per (n, c) over the spatial axes.

    ``spatial_dims`` 1, 2, 3 give ``n c l``, ``n c h w``, ``n c d h w``, e.g.
    ``'n c h w : norm over h w ; scale c ; shift c'``.

    Args:
        spatial_dims: number of spatial dims (1..3).
        eps: epsilon added to the variance.
        affine: include per-channel scale and shift steps.

    Raises:
        SpecError: ``spatial_dims`` out of range, ``eps`` invalid, or ``affine`` not a bool.
    """
    spatial = _SPATIAL[_check_int(spatial_dims, "spatial_dims", 1, 3)]
    return _channel_spec(tuple((a,) for a in ("n", "c") + spatial), spatial, ("c",), eps, affine)


def group_norm(groups: int, spatial_dims: int = 2, *, eps=1e-5, affine=True) -> Spec:
    """Group norm of an ``(n, c, *spatial)`` input, ``c = groups * k``: statistics per (n, group).

    E.g. ``'n (g k) h w : norm over k h w ; scale g k ; shift g k'`` with ``g=groups``; the scale and
    shift are per channel (indexed by ``g k``, i.e. a length-``c`` parameter).

    Args:
        groups: number of groups (positive int); the channel extent must be divisible by it.
        spatial_dims: number of spatial dims (1..3).
        eps: epsilon added to the variance.
        affine: include per-channel scale and shift steps.

    Raises:
        SpecError: ``groups`` not a positive int, ``spatial_dims`` out of range, ``eps`` invalid, or
            ``affine`` not a bool.
    """
    spatial = _SPATIAL[_check_int(spatial_dims, "spatial_dims", 1, 3)]
    dims = (("n",), ("g", "k")) + tuple((a,) for a in spatial)
    return _channel_spec(dims, ("k",) + spatial, ("g", "k"), eps, affine, (("g", groups),))


def batch_norm_stats(spatial_dims: int = 2, *, eps=1e-5, affine=True) -> Spec:
    """Batch-norm (training-mode) statistics of an ``(n, c, *spatial)`` input: per channel over n and space.

    ``spatial_dims`` 0..3 give ``n c``, ``n c l``, ``n c h w``, ``n c d h w``, e.g.
    ``'n c h w : norm over n h w ; scale c ; shift c'``.

    Args:
        spatial_dims: number of spatial dims (0..3).
        eps: epsilon added to the variance.
        affine: include per-channel scale and shift steps.

    Raises:
        SpecError: ``spatial_dims`` out of range, ``eps`` invalid, or ``affine`` not a bool.
    """
    spatial = _SPATIAL[_check_int(spatial_dims, "spatial_dims", 0, 3)]
    return _channel_spec(tuple((a,) for a in ("n", "c") + spatial), ("n",) + spatial, ("c",), eps, affine)
