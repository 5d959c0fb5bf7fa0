"""The review web app: the review API (``review.py``), the page (``review_page.py``,
``static/``), who the reviewer is (``review_auth.py``) and the OpenAPI document
(``openapi.py``)."""

__all__: list[str] = []
