"""The quickstart's client (README, Quickstart): the OpenAI SDK pointed at relmon's
traffic port instead of the model server. It asks one question and prints the answer it
was served: relmon relays the request to the model and its answer back unchanged, then
samples the exchange.

``OPENAI_BASE_URL`` overrides the address (default ``http://127.0.0.1:9110/v1``).
"""

import os

from openai import OpenAI

base_url = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:9110/v1")  # relmon, not the model
with OpenAI(base_url=base_url, api_key="unused") as client:
    completion = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "What is 2 + 3?"}],
        max_tokens=16,
        temperature=0.7,
    )
print(completion.choices[0].message.content)
