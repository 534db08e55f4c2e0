"""Password hashing (argon2id through argon2-cffi, not hand-rolled) and the password policy."""

from __future__ import annotations

import secrets
import string

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from tessera.core.errors import InvalidRequest

MIN_LENGTH = 12
MAX_LENGTH = 256
POLICY = (f"at least {MIN_LENGTH} characters with at least three of: lower-case letters, "
          "upper-case letters, digits, other characters; and not the user name")

_hasher = PasswordHasher()
_DUMMY = _hasher.hash("tessera-dummy-password")


def check_policy(password: str, user: str, field: str = "password") -> None:
    """Refuse a password below the policy (naming ``field`` and the rule), never showing it."""
    if len(password) > MAX_LENGTH:
        raise InvalidRequest(field, f"must be at most {MAX_LENGTH} characters")
    classes = sum((any(c.islower() for c in password), any(c.isupper() for c in password),
                   any(c.isdigit() for c in password),
                   any(not c.isalnum() for c in password)))
    if len(password) < MIN_LENGTH or classes < 3 or password.lower() == user.lower():
        raise InvalidRequest(field, f"is below the password policy: {POLICY}")


def generate() -> str:
    """A first password that passes the policy (to be changed at first login)."""
    alphabet = string.ascii_letters + string.digits + "-_.!"
    while True:
        value = "".join(secrets.choice(alphabet) for _ in range(20))
        try:
            check_policy(value, "")
            return value
        except InvalidRequest:
            continue


def hash_password(password: str) -> str:
    return _hasher.hash(password)


def verify(stored: str | None, password: str) -> bool:
    """Whether ``password`` matches; an unknown user costs the same time as a wrong password."""
    try:
        return _hasher.verify(stored or _DUMMY, password) and stored is not None
    except (VerificationError, InvalidHashError):
        return False
