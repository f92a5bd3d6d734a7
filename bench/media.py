"""Images in, side by side with llama-server (issue 43, item 8): time to first
token of

  1. a chat with one image never seen before (the projector encodes it, its
     tokens and the text are prefilled): turbospark / llama-server, target
     <= 1.0;
  2. a second question about the same image in the same conversation (the
     image's KV is reused, nothing is encoded again): second / first on
     turbospark, target <= 0.2 (llama-server's own ratio printed beside it).

Both servers get the same GGUF, projector, threads and context, and run
alternately within each round; each figure is the median over rounds,
measured at the client (streaming OpenAI chat, the image as a data URL).

No vision model can be downloaded here, so the projector is generated
(``tests/mmproj.py``) with random weights at a real encoder's size: ``base``
(a CLIP ViT-B/14 at 224 px, 256 image tokens, ~170 MB in f16, LLaVA-1.5's
shape at base size) by default, or ``tiny`` (the tests' 16-token one, whose
encode costs nothing). Random weights change no timing: the same matrices
are multiplied.

    python bench/media.py [--rounds 3] [--projector base|tiny] [--model smollm2-135m]
"""

from __future__ import annotations

import argparse
import base64
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, ROOT)

from runtime import Servers, gguf_of  # noqa: E402
from streams import stream_chat  # noqa: E402

from tests.media_samples import png  # noqa: E402
from tests.mmproj import BASE, TINY, write_mmproj  # noqa: E402


def data_url(image: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(image).decode()


def image(salt: int) -> bytes:
    """A picture no earlier request sent (its colour is the salt's)."""
    return png(320, 240, (salt * 37 % 256, salt * 91 % 256, salt * 53 % 256), stripe=salt % 2 == 0)


def ask(url: str, messages: list[dict], n: int) -> tuple[float, str]:
    # (ignore_eos: a random projector can make the model end at once, and an
    # answer without text has no first token to time)
    body = {"model": "m", "messages": messages, "max_tokens": n, "temperature": 0, "ignore_eos": True}
    s = stream_chat(url, body)
    if not s.first:
        raise SystemExit("an answer came without text: no time to first token")
    return s.ttft, s.text


def conversation(url: str, salt: int, n: int) -> tuple[float, float]:
    """(first TTFT, follow-up TTFT) of one conversation about a new image."""
    first = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Here is a photograph from my holiday."},
                {"type": "image_url", "image_url": {"url": data_url(image(salt))}},
                {"type": "text", "text": "What do you see in it?"},
            ],
        }
    ]
    t1, answer = ask(url, first, n)
    follow = [*first, {"role": "assistant", "content": answer}, {"role": "user", "content": "And the colours?"}]
    t2, _ = ask(url, follow, n)
    return t1, t2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--projector", choices=("base", "tiny"), default="base")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=8, help="answer tokens per turn")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    args = ap.parse_args()
    gguf = gguf_of(args.model)
    if gguf is None:
        sys.exit(f"model {args.model} is not installed")
    with tempfile.TemporaryDirectory() as tmp:
        mmproj = str(write_mmproj(Path(tmp) / "mmproj.gguf", tower=BASE if args.projector == "base" else TINY))
        sv = Servers(gguf, args.threads, 4096, 1)
        times: dict[str, list[tuple[float, float]]] = {"turbospark": [], "llama-server": []}
        salt = 0
        for r in range(args.rounds):
            for who in ("turbospark", "llama-server")[:: 1 if r % 2 == 0 else -1]:
                proc, url = sv.turbospark("--mmproj", mmproj) if who == "turbospark" else sv.peer("--mmproj", mmproj)
                try:
                    salt += 1
                    conversation(url, 1000 + salt, args.tokens)  # warm-up: a first encode allocates
                    salt += 1
                    times[who].append(conversation(url, salt, args.tokens))
                finally:
                    proc.terminate()
                    proc.wait()
    med = {who: (statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts)) for who, ts in times.items()}
    (ts1, ts2), (ll1, ll2) = med["turbospark"], med["llama-server"]
    tower = BASE if args.projector == "base" else TINY
    print(f"{args.model} + {args.projector} projector ({tower.n_tokens} image tokens), {args.rounds} rounds, medians")
    print(f"  first question TTFT   turbospark {ts1 * 1000:8.1f} ms   llama-server {ll1 * 1000:8.1f} ms")
    print(f"  follow-up TTFT        turbospark {ts2 * 1000:8.1f} ms   llama-server {ll2 * 1000:8.1f} ms")
    print(f"  first: turbospark / llama-server = {ts1 / ll1:.2f}   (target <= 1.0)")
    print(f"  follow-up / first: turbospark {ts2 / ts1:.2f}   (target <= 0.2; llama-server {ll2 / ll1:.2f})")


if __name__ == "__main__":
    main()
