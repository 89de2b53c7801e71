"""The one error of the sluice client, :class:`SluiceError`, and the one
place a Flight error becomes it.

A sluice server answers every error with a gRPC status code (Flight) or
an HTTP status (REST) and a stable *kind* (``checksum_mismatch``,
``dataset_not_found``, ``bad_sample``, …): REST sends them as JSON, Flight
as the status code and a message ``kind: what happened``. pyarrow raises
a Flight status as one of its exception classes, several codes sharing
one class, with the code's name in the text (``Flight returned not found
error, with message: …``). :func:`from_flight` reads the code from that
name and the kind from the message, so a trainer branches on
``e.code`` whichever protocol carried the error.
"""

import re
from typing import Optional

import pyarrow as pa
import pyarrow.flight as flight

# gRPC's codes as pyarrow names them in its messages, and the HTTP status
# a sluice server answers the same error with over REST.
_CODES = {
    "cancelled": ("CANCELLED", 409),
    "unknown": ("UNKNOWN", 500),
    "invalid argument": ("INVALID_ARGUMENT", 400),
    "timed out": ("DEADLINE_EXCEEDED", 504),
    "not found": ("NOT_FOUND", 404),
    "already exists": ("ALREADY_EXISTS", 409),
    "unauthorized": ("PERMISSION_DENIED", 403),
    "resource exhausted": ("RESOURCE_EXHAUSTED", 507),
    "precondition failed": ("FAILED_PRECONDITION", 409),
    "aborted": ("ABORTED", 409),
    "out-of-range": ("OUT_OF_RANGE", 400),
    "unimplemented": ("UNIMPLEMENTED", 501),
    "internal": ("INTERNAL", 500),
    "unavailable": ("UNAVAILABLE", 503),
    "data loss": ("DATA_LOSS", 500),
    "unauthenticated": ("UNAUTHENTICATED", 401),
}

_RETURNED = re.compile(r"(?:Flight|gRPC) returned (?P<code>[a-z -]+?) error, with message: ")
_WITH_MESSAGE = re.compile(r"with message: (?P<message>.*)", re.DOTALL)
_KIND = re.compile(r"(?P<kind>[a-z][a-z_]*): (?P<rest>.*)", re.DOTALL)
_DEBUG_TAIL = re.compile(r"\.? ?gRPC client debug context:.*$", re.DOTALL)


class SluiceError(Exception):
    """An error the service answered: ``status`` (HTTP), ``code`` (the
    stable kind, e.g. ``checksum_mismatch``), ``message`` (naming the
    culprit) and, for an error that came over Flight, ``grpc_code`` (e.g.
    ``DATA_LOSS``)."""

    def __init__(self, status: int, code: str, message: str, grpc_code: Optional[str] = None):
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.grpc_code = grpc_code


# pyarrow's exception classes and the codes they stand for, most specific
# first (several codes share a class; the text says which, when it can).
_CLASSES = [
    (flight.FlightUnauthenticatedError, "unauthenticated"),
    (flight.FlightUnauthorizedError, "unauthorized"),
    (flight.FlightUnavailableError, "unavailable"),
    (flight.FlightTimedOutError, "timed out"),
    (flight.FlightCancelledError, "cancelled"),
    (pa.ArrowKeyError, "not found"),
    (pa.ArrowNotImplementedError, "unimplemented"),
    (pa.ArrowInvalid, "invalid argument"),
]


def _class_code(e: BaseException) -> tuple:
    """The code a pyarrow exception's class says, where its text does not."""
    for cls, name in _CLASSES:
        if isinstance(e, cls):
            return _CODES[name]
    return _CODES["internal"]


def from_flight(e: BaseException, subject: str = "") -> SluiceError:
    """The :class:`SluiceError` of a pyarrow Flight error ``e``; ``subject``
    (``job j-1``, ``checkpoint 'x'``) goes before a message that does not
    name it."""
    text = str(e)
    returned = _RETURNED.search(text)
    if returned and returned.group("code") in _CODES:
        grpc_code, status = _CODES[returned.group("code")]
    else:
        # pyarrow words some codes otherwise ("Flight cancelled call"):
        # its class says which.
        grpc_code, status = _class_code(e)
    server = _WITH_MESSAGE.search(text)
    message = server.group("message") if server else text
    message = _DEBUG_TAIL.sub("", message).strip()
    kinded = _KIND.match(message)
    if kinded:
        kind, message = kinded.group("kind"), kinded.group("rest")
    else:
        # Not a sluice server's answer (the connection failed before one):
        # the code names it.
        kind = grpc_code.lower()
    if subject and subject not in message:
        message = f"{subject}: {message}"
    return SluiceError(status, kind, message, grpc_code)
