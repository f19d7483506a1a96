"""A real OpenAI-compatible server for the HTTP engine's tests: `/v1/completions`,
`/v1/chat/completions` and `/v1/models` over HTTP, answered by the local transformers engine on a real checkpoint
(chat messages through the checkpoint's own chat template), with vLLM's token-id and log-prob
extensions on completions. Knobs make it behave like other servers: `text_only` (a hosted API that
returns text alone) and `fail_next` (that many 503s before answering)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from training.inference.engine import SamplingParams
from training.inference.transformers_engine import TransformersEngine


class CompletionsServer:
    def __init__(self, engine: TransformersEngine, model: str = "crucible-tiny"):
        self.engine, self.model = engine, model
        self.text_only, self.fail_next, self.requests, self.chat_prompts = False, 0, [], []
        self._lock = threading.Lock()  # one generate at a time, as one model replica would
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
        threading.Thread(target=self._http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()

    def answer(self, route: str, body: dict) -> tuple[int, dict]:
        self.requests.append(body)
        if self.fail_next:
            self.fail_next -= 1
            return 503, {"error": {"message": "overloaded, try again"}}
        if body.get("model") != self.model:
            return 404, {"error": {"message": f"model {body.get('model')!r} does not exist"}}
        if route == "/v1/chat/completions":
            return self._chat(body)
        prompt = body.get("prompt")
        if not (isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
            return 400, {"error": {"message": "prompt must be a non-empty list of token ids here"}}
        params = SamplingParams(n=body.get("n", 1), max_new_tokens=body.get("max_tokens", 16),
                                temperature=body.get("temperature", 1.0), top_p=body.get("top_p", 1.0),
                                seed=body.get("seed") or 0)
        with self._lock:
            [completions] = self.engine.generate([prompt], params)
        return 200, {"object": "text_completion", "model": self.model,
                     "choices": [self._choice(i, c, body) for i, c in enumerate(completions)]}

    def _chat(self, body: dict) -> tuple[int, dict]:
        messages = body.get("messages")
        if not (isinstance(messages, list) and messages):
            return 400, {"error": {"message": "messages must be a non-empty list"}}
        text = self.engine.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt = self.engine.tokenizer.encode(text, add_special_tokens=False)
        params = SamplingParams(n=body.get("n", 1), max_new_tokens=body.get("max_tokens", 16),
                                temperature=body.get("temperature", 1.0), top_p=body.get("top_p", 1.0),
                                seed=body.get("seed") or 0)
        with self._lock:
            [completions] = self.engine.generate([prompt], params)
        self.chat_prompts.append(prompt)
        choices = [{"index": i, "message": {"role": "assistant", "content": self.engine.chat.reply_text(c.text)},
                    "finish_reason": c.finish_reason} for i, c in enumerate(completions)]
        return 200, {"object": "chat.completion", "model": self.model, "choices": choices}

    def _choice(self, index, completion, body) -> dict:
        choice = {"index": index, "text": completion.text, "finish_reason": completion.finish_reason, "logprobs": None}
        if body.get("logprobs") and not self.text_only:
            as_ids = body.get("return_tokens_as_token_ids")
            tokens = [f"token_id:{t}" if as_ids else self.engine.tokenizer.decode([t]) for t in completion.token_ids]
            choice["logprobs"] = {"tokens": tokens, "token_logprobs": completion.logprobs}
        return choice

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's naming)
                if self.path != "/v1/models":
                    return self._send(404, {"error": {"message": f"no route {self.path}"}})
                self._send(200, {"object": "list", "data": [{"id": server.model, "object": "model"}]})

            def do_POST(self):  # noqa: N802
                if self.path not in ("/v1/completions", "/v1/chat/completions"):
                    return self._send(404, {"error": {"message": f"no route {self.path}"}})
                try:
                    body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                except ValueError:
                    return self._send(400, {"error": {"message": "the body is not JSON"}})
                self._send(*server.answer(self.path, body))

            def _send(self, status: int, document: dict) -> None:
                data = json.dumps(document).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                """Quiet: http.server would log every request to stderr."""

        return Handler
