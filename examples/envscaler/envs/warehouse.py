class WarehouseInventory:
    """Stock by SKU with bin locations, customer orders and purchase orders."""

    def __init__(self, stock=None, orders=None, purchase_orders=None):
        self.stock = dict(stock or {})
        self.orders = dict(orders or {})
        self.purchase_orders = list(purchase_orders or [])

    def get_stock(self, sku):
        if sku not in self.stock:
            raise KeyError(f"unknown SKU {sku}")
        return {"sku": sku, **self.stock[sku]}

    def list_low_stock(self):
        return [{"sku": sku, "qty": item["qty"], "reorder_level": item["reorder_level"]}
                for sku, item in sorted(self.stock.items()) if item["qty"] < item["reorder_level"]]

    def receive_shipment(self, sku, quantity):
        if quantity <= 0:
            raise ValueError("quantity must be positive")
        self.get_stock(sku)
        self.stock[sku]["qty"] += quantity
        return {"sku": sku, "qty": self.stock[sku]["qty"]}

    def fulfill_order(self, order_id):
        order = self.orders.get(order_id)
        if order is None or order["status"] != "pending":
            raise ValueError(f"no pending order {order_id}")
        short = {sku: n for sku, n in order["lines"].items() if self.stock[sku]["qty"] < n}
        if short:
            raise ValueError(f"not enough stock for {sorted(short)}")
        for sku, n in order["lines"].items():
            self.stock[sku]["qty"] -= n
        order["status"] = "fulfilled"
        return {"order_id": order_id, "status": "fulfilled"}

    def move_item(self, sku, location):
        self.get_stock(sku)
        if not location or len(location) > 8:
            raise ValueError("location must be a bin code such as B3")
        self.stock[sku]["location"] = location
        return {"sku": sku, "location": location}

    def create_purchase_order(self, sku, quantity):
        self.get_stock(sku)
        if quantity <= 0:
            raise ValueError("quantity must be positive")
        po = {"po_id": f"PO{len(self.purchase_orders) + 1}", "sku": sku, "quantity": quantity}
        self.purchase_orders.append(po)
        return po
