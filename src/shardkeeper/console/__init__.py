"""The web console and REST API (``shardkeeper serve``; the ``console`` extra).

Server-rendered pages (Jinja2, no JavaScript build: one small vendored script
refreshes the live parts) and a JSON REST API under ``/api`` over
:class:`shardkeeper.ops.Operations`, with accounts and tokens of two roles (viewer,
operator), CSRF-checked forms and no registry credential in any page or answer.
See docs/console.md.

Modules: ``app`` (the factory), ``auth`` (accounts, tokens, roles), ``session``
(signed cookies, CSRF tokens), ``throttle`` (failed logins), ``deps`` (request
authentication), ``context`` (the shared state), ``render`` (templates), ``pages``
(GET pages, login), ``actions`` (the pages' forms), ``api`` (REST), ``forms`` (form
values to operations).
"""

from shardkeeper.console.app import create_app, open_console
from shardkeeper.console.auth import AuthConfig, Principal, hash_password, load_auth

__all__ = ["AuthConfig", "Principal", "create_app", "hash_password", "load_auth", "open_console"]
