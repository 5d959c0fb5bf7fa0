"""What relmon's aiohttp servers share: the metrics and health endpoint (``metrics.py``)
and the ``Expect`` header guard (``expect.py``) that the review app uses too. The traffic
data plane is ``adapters.traffic``, the review web app ``adapters.review``."""

__all__: list[str] = []
