"""Untrusted input, limits and secrets (docs/limits.md): `bounds` the limits
(`PHASELENS_LIMIT_*`); `yamlio` bounded YAML/JSON readers with line numbers; `fields`
constrained field types and their one-line errors; `urls` URL checks; `redact` secrets out of
files and messages; `names` safe path components."""
