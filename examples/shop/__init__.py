"""The shop: an order service on fusee, small but real (see examples/shop/README.md).

`models` (pydantic), `services` (the payment API over HTTP, the warehouse),
`workflows` (order, ship, settle; a queue, a schedule), `api` (the FastAPI
front, on a `fusee.Client`) and `payment_server` (a fake payment API that
fails 30% of the time). ``python -m examples.shop`` runs the demo.
"""
