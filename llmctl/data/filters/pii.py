"""PII: e-mail addresses, IP addresses and phone numbers replaced with fixed placeholders.

The patterns prefer precision: version numbers (`3.11.4`, `1.2.3-rc1`), dates (`2024-05-01`,
`01/02/2024`), times (`10:30:00`), hashes and hex identifiers are left alone. An IPv4
address is four dotted numbers 0-255 not inside a longer dotted or alphanumeric run; an IPv6
address is whatever Python's `ipaddress` accepts among colon-separated hex groups (at least
three groups, a digit somewhere, so `std::vector`, `a::b` and `10:30:00` are not); a phone
number is `+` and a country code followed by 7-14 more digits in groups, or the North
American `(555) 123-4567` / `555-123-4567` / `555.123.4567` forms.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

EMAIL_PLACEHOLDER = "<EMAIL>"
IP_PLACEHOLDER = "<IP_ADDRESS>"
PHONE_PLACEHOLDER = "<PHONE>"

_EMAIL = re.compile(
    r"(?<![\w.+-])[A-Za-z0-9][A-Za-z0-9._%+-]*@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*\.[A-Za-z]{2,24}(?![\w-])"
)
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IPV4 = re.compile(rf"(?<![\w.-]){_OCTET}(?:\.{_OCTET}){{3}}(?![\w-]|\.\d)")
_IPV6_CANDIDATE = re.compile(r"(?<![\w:.])[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,7}(?![\w:])")
_PHONE = re.compile(
    r"(?<![\w+.-])(?:"
    r"\+\d{1,3}(?:[ .-]?\(?\d{1,4}\)?)(?:[ .-]?\d{2,4}){2,4}"
    r"|\(\d{3}\) ?\d{3}[ .-]\d{4}"
    r"|\d{3}([.-])\d{3}\1\d{4}"
    r")(?![\w.-]?\d)"
)


def _ipv6(match: re.Match[str]) -> str:
    text = match.group()
    groups = [g for g in text.split(":") if g]
    if (len(groups) < 3 and "::" not in text) or not any(c.isdigit() for c in text):
        return text
    if len(groups) < 2:
        return text
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return text
    return IP_PLACEHOLDER


def _phone(match: re.Match[str]) -> str:
    digits = sum(c.isdigit() for c in match.group())
    return PHONE_PLACEHOLDER if 10 <= digits <= 15 else match.group()


@dataclass(kw_only=True)
class PiiConfig:
    """Which kinds of PII to replace (all by default when the step is on)."""

    emails: bool = True
    """Replace e-mail addresses with <EMAIL>."""
    ips: bool = True
    """Replace IPv4 and IPv6 addresses with <IP_ADDRESS>."""
    phones: bool = True
    """Replace phone numbers with <PHONE>."""

    def redact(self, text: str) -> tuple[str, dict[str, int]]:
        """The text with PII replaced, and how many of each kind were replaced."""
        counts = {"email": 0, "ip": 0, "phone": 0}
        if self.emails and "@" in text:
            text, counts["email"] = _EMAIL.subn(EMAIL_PLACEHOLDER, text)
        if self.ips:
            if "." in text:
                text, counts["ip"] = _IPV4.subn(IP_PLACEHOLDER, text)
            if "::" in text or text.count(":") >= 3:
                before = text.count(IP_PLACEHOLDER)
                text = _IPV6_CANDIDATE.sub(_ipv6, text)
                counts["ip"] += text.count(IP_PLACEHOLDER) - before
        if self.phones:
            before = text.count(PHONE_PLACEHOLDER)
            text = _PHONE.sub(_phone, text)
            counts["phone"] = text.count(PHONE_PLACEHOLDER) - before
        return text, counts
