"""A small web shop to train browser agents on, and tasks checked from its state.

`ShopSite` serves server-rendered HTML on 127.0.0.1 (a free port) from the standard library:
a home page with a search field and the catalogue, a page per product with a quantity field
and an "Add to cart" button, a cart with "Remove" buttons and "Checkout", and an order page.
Every page has links Home and Cart; the footer also links to an outside help site, a catalogue
download and a page in a new tab, which the browser environment refuses. Its state (`cart`,
`orders`) is what the tasks' checkers read -- the WebArena idea at a size one CPU can run.

Task kinds: `add` (put N of a product in the cart), `remove` (the cart starts with two
products; take one out), `buy` (order one of a product), `price` (answer a product's price).
`make_shop_splits` splits by product, so the held-out tasks name products never seen in
training.
"""

from __future__ import annotations

import html
import random
import re
import threading
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from forge_bridge.core.errors import InvalidArgument, InvalidState
from forge_bridge.envs.tool import ToolTask


@dataclass(frozen=True)
class Product:
    sku: str
    name: str
    price: int
    """Whole dollars."""
    description: str


CATALOGUE = (
    Product("mug-blue", "Blue mug", 8, "A 300 ml stoneware mug, glazed blue."),
    Product("mug-red", "Red mug", 9, "A 300 ml stoneware mug, glazed red."),
    Product("mug-travel", "Travel mug", 15, "A lidded steel mug that keeps coffee hot."),
    Product("nb-a5", "A5 lined notebook", 6, "96 lined pages, stitched."),
    Product("nb-grid", "Grid notebook", 7, "A4, 5 mm grid, 80 pages."),
    Product("nb-pocket", "Pocket notebook", 4, "A6, plain pages, elastic band."),
    Product("pen-gel", "Black gel pen", 2, "0.5 mm black gel ink."),
    Product("pen-fountain", "Fountain pen", 24, "A steel nib, refillable converter."),
    Product("bag-tote", "Canvas tote bag", 12, "Heavy cotton canvas, long handles."),
    Product("bag-back", "Small backpack", 35, "12 litres, a laptop sleeve."),
    Product("lamp-desk", "Desk lamp", 29, "An LED lamp on an arm, three brightness levels."),
    Product("plant-pot", "Plant pot", 11, "A terracotta pot with a saucer, 14 cm."),
)
BY_SKU = {p.sku: p for p in CATALOGUE}
KINDS = ("add", "remove", "buy", "price")


class ShopSite:
    """The shop, served on 127.0.0.1; `cart` (sku -> quantity) and `orders` are its state."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.lock = threading.Lock()
        self.cart: dict[str, int] = {}
        self.orders: list[dict[str, int]] = []
        self.initial_cart: dict[str, int] = {}
        self._server: ThreadingHTTPServer | None = None

    # ------------------------------------------------------------------ LocalSite
    def start(self) -> str:
        if self._server is None:
            self._server = ThreadingHTTPServer((self.host, 0), _handler_for(self))
            self._server.daemon_threads = True
            threading.Thread(target=self._server.serve_forever, daemon=True, name="shop-site").start()
        return self.url

    @property
    def url(self) -> str:
        if self._server is None:
            raise InvalidState("the shop is not running")
        return f"http://{self.host}:{self._server.server_address[1]}"

    def reset(self) -> None:
        with self.lock:
            self.cart = dict(self.initial_cart)
            self.orders = []

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # ------------------------------------------------------------------ pages
    def page(self, path: str, query: dict[str, str]) -> tuple[int, str]:
        if path == "/":
            items = "".join(f'<li><a href="/product/{p.sku}">{html.escape(p.name)}</a></li>' for p in CATALOGUE)
            return 200, _layout("Shop", f"<h1>Shop</h1>{_SEARCH_FORM}<h2>All products</h2><ul>{items}</ul>", self.cart)
        if path == "/search":
            q = query.get("q", "").strip().lower()
            found = [p for p in CATALOGUE if q and q in p.name.lower()]
            items = "".join(f'<li><a href="/product/{p.sku}">{html.escape(p.name)}</a></li>' for p in found)
            body = f"{_SEARCH_FORM}<h2>Results for {html.escape(q)!s}</h2>" + (f"<ul>{items}</ul>" if found
                                                                               else "<p>No products found.</p>")
            return 200, _layout("Search", body, self.cart)
        if path.startswith("/product/"):
            product = BY_SKU.get(path.removeprefix("/product/"))
            if product is None:
                return 404, _layout("Not found", "<p>No such product.</p>", self.cart)
            body = (f"<h1>{html.escape(product.name)}</h1><p>Price: ${product.price}</p>"
                    f"<p>{html.escape(product.description)}</p>"
                    f'<form method="post" action="/cart/add"><input type="hidden" name="sku" value="{product.sku}">'
                    f'<label>Quantity <input name="quantity" type="number" value="1" min="1" max="20" '
                    f'aria-label="Quantity"></label> <button type="submit">Add to cart</button></form>')
            return 200, _layout(product.name, body, self.cart)
        if path == "/cart":
            with self.lock:
                lines = [(BY_SKU[sku], qty) for sku, qty in self.cart.items()]
            rows = "".join(
                f'<li>{html.escape(p.name)} x {qty} (${p.price * qty}) <form method="post" action="/cart/remove" '
                f'style="display:inline"><input type="hidden" name="sku" value="{p.sku}">'
                f'<button type="submit">Remove {html.escape(p.name)}</button></form></li>' for p, qty in lines)
            total = sum(p.price * qty for p, qty in lines)
            body = (f"<h1>Cart</h1><ul>{rows}</ul><p>Total: ${total}</p>"
                    '<form method="post" action="/checkout"><button type="submit">Checkout</button></form>'
                    if lines else "<h1>Cart</h1><p>Your cart is empty.</p>")
            return 200, _layout("Cart", body, self.cart)
        if path.startswith("/order/"):
            number = path.removeprefix("/order/")
            if not number.isdigit() or not 1 <= int(number) <= len(self.orders):
                return 404, _layout("Not found", "<p>No such order.</p>", self.cart)
            order = self.orders[int(number) - 1]
            items = "".join(f"<li>{html.escape(BY_SKU[s].name)} x {q}</li>" for s, q in order.items())
            return 200, _layout("Order placed", f"<h1>Thank you! Order placed.</h1><ul>{items}</ul>", self.cart)
        return 404, _layout("Not found", "<p>No such page.</p>", self.cart)

    def post(self, path: str, form: dict[str, str]) -> tuple[int, str]:
        """Change the state; answer with where to go next (a 303 redirect)."""
        with self.lock:
            sku = form.get("sku", "")
            if path == "/cart/add" and sku in BY_SKU:
                try:
                    quantity = int(form.get("quantity", "1"))
                except ValueError:
                    quantity = 0
                if not 1 <= quantity <= 20:
                    return 400, "/product/" + sku
                self.cart[sku] = self.cart.get(sku, 0) + quantity
                return 303, "/cart"
            if path == "/cart/remove" and sku in self.cart:
                del self.cart[sku]
                return 303, "/cart"
            if path == "/checkout" and self.cart:
                self.orders.append(dict(self.cart))
                self.cart = {}
                return 303, f"/order/{len(self.orders)}"
        return 400, "/cart"


_SEARCH_FORM = ('<form action="/search" method="get"><input name="q" aria-label="Search products" '
                'placeholder="Search products"> <button type="submit">Search</button></form>')


def _layout(title: str, body: str, cart: dict[str, int]) -> str:
    count = sum(dict(cart).values())  # a copy: a POST may be changing the cart
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head><body>"
            f'<nav><a href="/">Home</a> <a href="/cart">Cart ({count})</a></nav><main>{body}</main>'
            '<footer><a href="https://help.example.com/shop">Help centre</a> '
            '<a href="/catalogue.csv">Download the catalogue</a> '
            '<a href="/" target="_blank">Open in a new tab</a></footer></body></html>')


def _handler_for(site: ShopSite) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, status: int, body: bytes, content_type: str, **headers: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in headers.items():
                self.send_header(name.replace("_", "-"), value)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            if url.path == "/catalogue.csv":
                rows = "sku,name,price\n" + "".join(f"{p.sku},{p.name},{p.price}\n" for p in CATALOGUE)
                self._send(200, rows.encode(), "text/csv",
                           Content_Disposition='attachment; filename="catalogue.csv"')
                return
            query = dict(urllib.parse.parse_qsl(url.query))
            status, page = site.page(url.path, query)
            self._send(status, page.encode(), "text/html; charset=utf-8")

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            form = dict(urllib.parse.parse_qsl(self.rfile.read(length).decode("utf-8", errors="replace")))
            status, where = site.post(urllib.parse.urlsplit(self.path).path, form)
            if status == 303:
                self._send(303, b"", "text/plain", Location=where)
            else:
                self._send(400, _layout("Error", f'<p>That did not work. <a href="{where}">Back</a></p>',
                                        site.cart).encode(), "text/html; charset=utf-8")

    return Handler


# ---------------------------------------------------------------------- tasks
def _cart_is(expected: dict[str, int]):
    def check(answer: str, env: Any) -> bool:
        return env.site.cart == expected

    return check


def _ordered(expected: dict[str, int]):
    def check(answer: str, env: Any) -> bool:
        return env.site.orders == [expected]

    return check


def _answered_price(price: int):
    def check(answer: str, env: Any) -> bool:  # one price, the right one (not a list of guesses)
        numbers = {float(x) for x in re.findall(r"\d+(?:\.\d+)?", answer)}
        return numbers == {float(price)}

    return check


def _start_with(cart: dict[str, int]):
    def setup(env: Any) -> None:
        with env.site.lock:
            env.site.cart = dict(cart)

    return setup


def make_task(kind: str, product: Product, other: Product, quantity: int = 1) -> ToolTask:
    """One task of `kind` about `product` (`other` is the second item a `remove` cart holds)."""
    if kind == "add":
        return ToolTask(f"add-{product.sku}-{quantity}", f"Add {quantity} {product.name} to the cart.",
                        check=_cart_is({product.sku: quantity}))
    if kind == "remove":
        return ToolTask(f"remove-{product.sku}", f"Remove the {product.name} from the cart.",
                        check=_cart_is({other.sku: 1}), setup=_start_with({other.sku: 1, product.sku: 1}))
    if kind == "buy":
        return ToolTask(f"buy-{product.sku}", f"Buy one {product.name}: add it to the cart and check out.",
                        check=_ordered({product.sku: 1}))
    if kind == "price":
        return ToolTask(f"price-{product.sku}", f"What does the {product.name} cost in dollars? Answer with "
                        "the number.", check=_answered_price(product.price))
    raise InvalidArgument(f"kind: expected one of {KINDS}, got {kind!r}")


def make_shop_splits(seed: int = 0, held_out_products: int = 4) -> tuple[list[ToolTask], list[ToolTask]]:
    """(train, held-out) tasks of every kind; the held-out ones name products training never saw."""
    # at least 2 on each side: a `remove` task needs a second product in its cart
    if not 2 <= held_out_products <= len(CATALOGUE) - 2:
        raise InvalidArgument(f"held_out_products: expected 2..{len(CATALOGUE) - 2}, got {held_out_products!r}")
    rng = random.Random(seed)
    products = list(CATALOGUE)
    rng.shuffle(products)
    held, train = products[:held_out_products], products[held_out_products:]

    def tasks(group: list[Product]) -> list[ToolTask]:
        out = []
        for i, product in enumerate(group):
            other = group[(i + 1) % len(group)]
            for kind in KINDS:
                out.append(make_task(kind, product, other, quantity=1 + rng.randrange(3) if kind == "add" else 1))
        return out

    return tasks(train), tasks(held)


__all__ = ["CATALOGUE", "KINDS", "Product", "ShopSite", "make_shop_splits", "make_task"]
