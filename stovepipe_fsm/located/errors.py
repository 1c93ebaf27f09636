"""Located errors for the declarative files.

Every problem a user can cause by editing YAML is reported as ``file:line:column: message``
so an editor or CI log jumps straight to it. Lines and columns are 1-based and come
from the YAML source itself, never from a re-dump.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Location:
    """A 1-based position in a source file."""

    file: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


@dataclass(frozen=True)
class SpecIssue:
    """One problem found in a declarative file (schema, lint or syntax)."""

    location: Location
    message: str
    rule: str = "schema"

    def __str__(self) -> str:
        return f"{self.location}: {self.message}"

    def as_dict(self) -> dict[str, object]:
        return {
            "file": self.location.file,
            "line": self.location.line,
            "column": self.location.column,
            "rule": self.rule,
            "message": self.message,
        }


class SpecError(Exception):
    """Raised when a declarative file cannot be used; carries every issue found."""

    def __init__(self, issues: Iterable[SpecIssue]) -> None:
        self.issues: tuple[SpecIssue, ...] = tuple(sorted(issues, key=_issue_key))
        super().__init__("\n".join(str(i) for i in self.issues) or "invalid specification")

    def __iter__(self) -> Iterator[SpecIssue]:
        return iter(self.issues)


def _issue_key(issue: SpecIssue) -> tuple[Location, str]:
    return (issue.location, issue.message)
