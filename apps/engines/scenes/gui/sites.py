"""The bundled web apps of the gui scene's `site` source: a shop, a web mail client, an admin form.

Runs INSIDE the sandbox, in a thread of the browser server (server.py), on 127.0.0.1:<port>;
stdlib only. Each app's whole state is one JSON file (`state_path`), rewritten after every
change: the verifier reads it (check `site_state`), the agent cannot (the browser reaches only
the app's origin). `data` in the site config replaces the app's starting data.

    shop:  /  products, "Add to cart"  ->  /cart  quantities, "Remove", "Checkout"  ->  /checkout
           a form (name, address, shipping) that validates  ->  /order/<id>
           state {"cart": [{"sku", "qty"}], "orders": [{"id", "name", "address", "shipping", "items", "total"}]}
    mail:  /  inbox  ->  /message/<id>  "Delete", "Reply"  ;  /compose  to, subject, body  ->  "Send"
           state {"inbox": [...], "sent": [...], "trash": [...]}
    admin: /  users  ->  /users/new  a form with validation (username, email, role, age)  ->  /
           state {"users": [{"username", "email", "role", "age"}]}
"""
from __future__ import annotations

import html
import json
import os
import re
import threading
from socketserver import ThreadingMixIn
from typing import Any, Callable
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

SHOP = {"products": [
    {"sku": "mug", "name": "Blue mug", "price": 8.5},
    {"sku": "lamp", "name": "Desk lamp", "price": 24.0},
    {"sku": "notebook", "name": "Dotted notebook", "price": 6.25},
    {"sku": "pen", "name": "Fountain pen", "price": 15.0},
], "shipping": {"standard": 4.0, "express": 12.0}, "cart": [], "orders": []}
MAIL = {"inbox": [
    {"id": "m1", "from": "ana@example.org", "subject": "Lunch on Friday?", "body": "Are you free for lunch on Friday at noon?"},
    {"id": "m2", "from": "billing@example.com", "subject": "Your invoice #4411", "body": "Invoice #4411 for 120.00 EUR is attached."},
    {"id": "m3", "from": "newsletter@example.net", "subject": "Weekly deals", "body": "Ten percent off all lamps this week."},
    {"id": "m4", "from": "leo@example.org", "subject": "Project kickoff", "body": "The kickoff moved to Tuesday 10:00."},
], "sent": [], "trash": []}
ADMIN = {"users": [{"username": "root", "email": "root@example.org", "role": "admin", "age": 40}],
         "roles": ["viewer", "editor", "admin"]}
DEFAULTS = {"shop": SHOP, "mail": MAIL, "admin": ADMIN}
USERNAME_RE = re.compile(r"^[a-z][a-z0-9_]{2,15}$")
EMAIL_RE = re.compile(r"^[^@\s]+@[^@\s]+\.[a-z]{2,}$")

Response = tuple[str, str, list[tuple[str, str]]]  # status, body, headers
# The apps need no script at all: none runs, whatever markup reached a page (every value is escaped too).
SITE_CSP = ("default-src 'none'; script-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
            "form-action 'self'; base-uri 'none'; frame-ancestors 'none'")


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def page(title: str, body: str) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)}</title>"
            "<style>body{font:14px sans-serif;margin:12px}table{border-collapse:collapse}"
            "td,th{padding:3px 6px;border-bottom:1px solid #ddd}.error{color:#b00}nav a{margin-right:10px}</style>"
            f"</head><body>{body}</body></html>")


def sku_button(action: str, sku: str, label: str, text: str) -> str:
    """A one-button form posting `sku` to `action` (its accessible name `label`)."""
    return (f"<form method='post' action='{esc(action)}'><input type='hidden' name='sku' value='{esc(sku)}'>"
            f"<button aria-label='{esc(label)}'>{esc(text)}</button></form>")


def redirect(location: str) -> Response:
    return "303 See Other", "", [("Location", location)]


def ok(title: str, body: str) -> Response:
    return "200 OK", page(title, body), []


class Site:
    """One app: its state (loaded from the file when present) and its routes."""

    def __init__(self, name: str, state_path: str, data: dict[str, Any] | None = None):
        if name not in DEFAULTS:
            raise ValueError(f"unknown site {name!r}; sites: {', '.join(DEFAULTS)}")
        self.name, self.path = name, state_path
        self.lock = threading.Lock()
        if os.path.exists(state_path):
            with open(state_path, encoding="utf-8") as fh:
                self.state = json.load(fh)
        else:
            self.state = json.loads(json.dumps(data or DEFAULTS[name]))
            self.save()

    def save(self) -> None:
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        tmp = f"{self.path}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(self.state, fh, indent=1, sort_keys=True)
        os.replace(tmp, self.path)

    def handle(self, method: str, path: str, form: dict[str, str]) -> Response:
        handler: Callable[[str, str, dict[str, str]], Response] = getattr(self, f"{self.name}_routes")
        with self.lock:
            return handler(method, path, form)

    # -- shop

    def shop_nav(self) -> str:
        count = sum(i["qty"] for i in self.state["cart"])
        return f"<nav><a href='/'>Products</a><a href='/cart'>Cart ({count})</a></nav>"

    def shop_routes(self, method: str, path: str, form: dict[str, str]) -> Response:
        state = self.state
        products = {p["sku"]: p for p in state["products"]}
        if path == "/" and method == "GET":
            rows = "".join(
                f"<tr><td>{esc(p['name'])}</td><td>${p['price']:.2f}</td>"
                f"<td>{sku_button('/cart/add', p['sku'], 'Add ' + p['name'] + ' to cart', 'Add to cart')}</td></tr>"
                for p in state["products"])
            return ok("Shop", f"{self.shop_nav()}<h1>Products</h1><table>{rows}</table>")
        if path == "/cart/add" and method == "POST":
            sku = form.get("sku", "")
            if sku in products:
                line = next((i for i in state["cart"] if i["sku"] == sku), None)
                if line:
                    line["qty"] += 1
                else:
                    state["cart"].append({"sku": sku, "qty": 1})
                self.save()
            return redirect("/cart")
        if path == "/cart/remove" and method == "POST":
            state["cart"] = [i for i in state["cart"] if i["sku"] != form.get("sku")]
            self.save()
            return redirect("/cart")
        if path == "/cart" and method == "GET":
            rows = "".join(
                f"<tr><td>{esc(products[i['sku']]['name'])}</td><td>{i['qty']}</td>"
                f"<td>{sku_button('/cart/remove', i['sku'], 'Remove ' + products[i['sku']]['name'], 'Remove')}</td></tr>"
                for i in state["cart"])
            total = sum(products[i["sku"]]["price"] * i["qty"] for i in state["cart"])
            checkout = "<p><a href='/checkout'>Checkout</a></p>" if state["cart"] else "<p>Your cart is empty.</p>"
            return ok("Cart", f"{self.shop_nav()}<h1>Cart</h1><table>{rows}</table><p>Subtotal: ${total:.2f}</p>{checkout}")
        if path == "/checkout":
            errors: list[str] = []
            if method == "POST":
                if not form.get("name", "").strip():
                    errors.append("Name is required.")
                if len(form.get("address", "").strip()) < 5:
                    errors.append("Address is required (at least 5 characters).")
                if form.get("shipping") not in state["shipping"]:
                    errors.append("Choose a shipping method.")
                if not state["cart"]:
                    errors.append("The cart is empty.")
                if not errors:
                    items = [dict(i) for i in state["cart"]]
                    total = sum(products[i["sku"]]["price"] * i["qty"] for i in items) + state["shipping"][form["shipping"]]
                    order = {"id": f"A{1001 + len(state['orders'])}", "name": form["name"].strip(),
                             "address": form["address"].strip(), "shipping": form["shipping"], "items": items,
                             "total": round(total, 2)}
                    state["orders"].append(order)
                    state["cart"] = []
                    self.save()
                    return redirect(f"/order/{order['id']}")
            options = "".join(f"<option value='{esc(k)}'>{esc(k)} (${v:.2f})</option>" for k, v in state["shipping"].items())
            errs = "".join(f"<p class='error' role='alert'>{esc(e)}</p>" for e in errors)
            return ok("Checkout", f"{self.shop_nav()}<h1>Checkout</h1>{errs}<form method='post' action='/checkout'>"
                      f"<label>Name <input name='name' value='{esc(form.get('name', ''))}'></label><br>"
                      f"<label>Address <input name='address' value='{esc(form.get('address', ''))}'></label><br>"
                      f"<label>Shipping <select name='shipping'><option value=''>choose</option>{options}</select></label><br>"
                      "<button>Place order</button></form>")
        match = re.fullmatch(r"/order/(A\d+)", path)
        if match:
            order = next((o for o in state["orders"] if o["id"] == match.group(1)), None)
            if order:
                return ok("Order placed", f"{self.shop_nav()}<h1>Thank you!</h1><p>Order {esc(order['id'])} "
                          f"total ${order['total']:.2f} ships {esc(order['shipping'])}.</p>")
        return "404 Not Found", page("Not found", "<h1>Not found</h1>"), []

    # -- mail

    def mail_routes(self, method: str, path: str, form: dict[str, str]) -> Response:
        state = self.state
        nav = "<nav><a href='/'>Inbox</a><a href='/compose'>Compose</a></nav>"
        if path == "/" and method == "GET":
            rows = "".join(f"<tr><td>{esc(m['from'])}</td><td><a href='/message/{esc(m['id'])}'>{esc(m['subject'])}</a></td></tr>"
                           for m in state["inbox"])
            return ok("Inbox", f"{nav}<h1>Inbox ({len(state['inbox'])})</h1><table>{rows}</table>")
        match = re.fullmatch(r"/message/(\w+)(/delete)?", path)
        if match:
            message = next((m for m in state["inbox"] if m["id"] == match.group(1)), None)
            if message is None:
                return "404 Not Found", page("Not found", f"{nav}<h1>No such message</h1>"), []
            if match.group(2) and method == "POST":
                state["inbox"].remove(message)
                state["trash"].append(message)
                self.save()
                return redirect("/")
            return ok(message["subject"], f"{nav}<h1>{esc(message['subject'])}</h1><p>From: {esc(message['from'])}</p>"
                      f"<p>{esc(message['body'])}</p><form method='post' action='/message/{esc(message['id'])}/delete'>"
                      f"<button>Delete</button></form><p><a href='/compose?reply={esc(message['id'])}'>Reply</a></p>")
        if path == "/compose":
            errors: list[str] = []
            if method == "POST":
                if not EMAIL_RE.match(form.get("to", "").strip()):
                    errors.append("Enter a valid recipient address.")
                if not form.get("subject", "").strip():
                    errors.append("The subject is empty.")
                if not errors:
                    state["sent"].append({"to": form["to"].strip(), "subject": form["subject"].strip(),
                                          "body": form.get("body", "").strip()})
                    self.save()
                    return ok("Sent", f"{nav}<h1>Message sent</h1>")
            errs = "".join(f"<p class='error' role='alert'>{esc(e)}</p>" for e in errors)
            return ok("Compose", f"{nav}<h1>Compose</h1>{errs}<form method='post' action='/compose'>"
                      f"<label>To <input name='to' value='{esc(form.get('to', ''))}'></label><br>"
                      f"<label>Subject <input name='subject' value='{esc(form.get('subject', ''))}'></label><br>"
                      f"<label>Body <textarea name='body'>{esc(form.get('body', ''))}</textarea></label><br>"
                      "<button>Send</button></form>")
        return "404 Not Found", page("Not found", f"{nav}<h1>Not found</h1>"), []

    # -- admin

    def admin_routes(self, method: str, path: str, form: dict[str, str]) -> Response:
        state = self.state
        nav = "<nav><a href='/'>Users</a><a href='/users/new'>New user</a></nav>"
        if path == "/" and method == "GET":
            rows = "".join(f"<tr><td>{esc(u['username'])}</td><td>{esc(u['email'])}</td><td>{esc(u['role'])}</td>"
                           f"<td>{u['age']}</td></tr>" for u in state["users"])
            return ok("Users", f"{nav}<h1>Users</h1><table><tr><th>Username</th><th>Email</th><th>Role</th><th>Age</th></tr>"
                      f"{rows}</table>")
        if path == "/users/new":
            errors: list[str] = []
            if method == "POST":
                username = form.get("username", "").strip()
                if not USERNAME_RE.match(username):
                    errors.append("Username: 3-16 lowercase letters, digits or _, starting with a letter.")
                elif any(u["username"] == username for u in state["users"]):
                    errors.append("Username: already taken.")
                if not EMAIL_RE.match(form.get("email", "").strip()):
                    errors.append("Email: not a valid address.")
                if form.get("role") not in state["roles"]:
                    errors.append("Role: choose one.")
                age = form.get("age", "").strip()
                if not age.isdigit() or not 18 <= int(age) <= 99:
                    errors.append("Age: a whole number from 18 to 99.")
                if not errors:
                    state["users"].append({"username": username, "email": form["email"].strip(),
                                           "role": form["role"], "age": int(age)})
                    self.save()
                    return redirect("/")
            roles = "".join(f"<option value='{esc(r)}'{' selected' if form.get('role') == r else ''}>{esc(r)}</option>"
                            for r in state["roles"])
            errs = "".join(f"<p class='error' role='alert'>{esc(e)}</p>" for e in errors)
            return ok("New user", f"{nav}<h1>New user</h1>{errs}<form method='post' action='/users/new'>"
                      f"<label>Username <input name='username' value='{esc(form.get('username', ''))}'></label><br>"
                      f"<label>Email <input name='email' value='{esc(form.get('email', ''))}'></label><br>"
                      f"<label>Role <select name='role'><option value=''>choose</option>{roles}</select></label><br>"
                      f"<label>Age <input name='age' value='{esc(form.get('age', ''))}'></label><br>"
                      "<button>Create user</button></form>")
        return "404 Not Found", page("Not found", f"{nav}<h1>Not found</h1>"), []


def wsgi_app(site: Site) -> Callable[..., list[bytes]]:
    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        form: dict[str, str] = {k: v[0] for k, v in parse_qs(environ.get("QUERY_STRING", "")).items()}
        if method == "POST":
            length = int(environ.get("CONTENT_LENGTH") or 0)
            body = environ["wsgi.input"].read(min(length, 1 << 20)).decode("utf-8", "replace")
            form.update({k: v[0] for k, v in parse_qs(body, keep_blank_values=True).items()})
        status, text, headers = site.handle(method, environ.get("PATH_INFO", "/"), form)
        data = text.encode("utf-8")
        start_response(status, [("Content-Type", "text/html; charset=utf-8"), ("Content-Length", str(len(data))),
                                ("Cache-Control", "no-store"), ("Content-Security-Policy", SITE_CSP), *headers])
        return [data]

    return app


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args: Any) -> None:  # stdout/stderr belong to the MCP server
        pass


def serve_in_thread(config: dict[str, Any]) -> Any:
    """Start the app of `config` ({name, port, state_path, data?}) on 127.0.0.1 in a daemon thread."""
    site = Site(config["name"], config["state_path"], config.get("data"))
    server = make_server("127.0.0.1", int(config["port"]), wsgi_app(site), server_class=_Server, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, name=f"site-{site.name}", daemon=True).start()
    return server
