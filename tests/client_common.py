"""What the openai client checks share (tests/openai_*_check.py): the
client of the server under test, and check()."""
import sys

from openai import OpenAI


def client_for(base):
    """The official client of the server at base, without retries."""
    return OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)


def check(cond, what):
    """Exits with FAIL and what, unless cond."""
    if not cond:
        sys.exit("FAIL: " + what)
