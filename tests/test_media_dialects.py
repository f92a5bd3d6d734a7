"""Images and sound from every dialect (issue 43, items 2 and 5), on a real
server: the bundled SmolLM2 with the tests' random vision projector ("eye",
16 tokens an image) and with the random audio projector ("ear", 75 tokens a
sound of at most 30 s), through the official clients.

Random weights say nothing of what the model sees, so the tests check what
is true anyway: each dialect's form reaches the engine (the prompt's token
count is the same request's without the media, plus each item's tokens),
in order and across turns; and each bad item is a 400 (a 413 for a body
over the limit) in its dialect's own error shape, naming the problem,
before the engine decodes anything."""

from __future__ import annotations

import base64
import struct
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from turbospark.engine import media

if not media.available():
    pytest.skip("this llama-cpp-python is built without libmtmd (scripts/llama-wheel.sh)", allow_module_level=True)

from turbospark import Server  # noqa: E402
from turbospark.core.media import MAX_IMAGE_PIXELS, check_item, image_size, sniff  # noqa: E402
from turbospark.core.request import Media  # noqa: E402
from turbospark.engine.model import ModelOptions  # noqa: E402
from turbospark.models.catalog import resolve_model  # noqa: E402

from .media_samples import RED, STRIPED, TONE_THEN_NOISE  # noqa: E402
from .mmproj import N_IMAGE_TOKENS, write_mmproj  # noqa: E402
from .mmproj_audio import N_AUDIO_TOKENS, write_audio_mmproj  # noqa: E402
from .support import assert_anthropic_error, assert_ollama_error, assert_openai_error  # noqa: E402

MAX_IMAGES = 4
MAX_BODY = 1 << 20


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{b64(data)}"


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_declaring(width: int, height: int, idat: bytes | None = None) -> bytes:
    """A tiny PNG whose header declares ``width`` × ``height`` (a
    decompression bomb when large; ``idat``: its pixel data as given)."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    pixels = idat if idat is not None else zlib.compress(b"\x00" * 64)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", pixels) + _chunk(b"IEND", b"")


BOMB = png_declaring(100_000, 100_000)
BROKEN = png_declaring(8, 8, idat=b"this is not zlib data at all")  # (a PNG header; pixels that do not decode)


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("mmproj")
    path, _ = resolve_model("smollm2-135m")
    common: dict[str, Any] = {"path": path, "ctx": 2048, "threads": 2, "gpu_layers": 0, "parallel": 1}
    models = [
        ModelOptions(id="eye", mmproj=str(write_mmproj(folder / "mmproj-576.gguf")), **common),
        ModelOptions(id="ear", mmproj=str(write_audio_mmproj(folder / "mmproj-audio-576.gguf")), **common),
    ]
    server = Server(models=models, max_images=MAX_IMAGES, max_body=MAX_BODY).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def oai(srv: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def ant(srv: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def oll(srv: Server) -> ollama.Client:
    return ollama.Client(host=srv.url, timeout=120)


# ------------------------------------------------------------ each dialect's form
def chat_tokens(oai: openai.OpenAI, content: Any, model: str = "eye", history: list[Any] | None = None) -> int:
    messages = [*(history or []), {"role": "user", "content": content}]
    r = oai.chat.completions.create(model=model, messages=messages, max_tokens=1, temperature=0)
    assert r.usage is not None
    return r.usage.prompt_tokens


def image_part(data: bytes, detail: str = "auto") -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": data_url(data), "detail": detail}}


QUESTION = {"type": "text", "text": "What is in the picture?"}


def test_openai_chat_images_reach_the_engine_in_order(oai: openai.OpenAI) -> None:
    text = chat_tokens(oai, [QUESTION])
    assert chat_tokens(oai, [QUESTION, image_part(RED, "high")]) == text + N_IMAGE_TOKENS
    assert chat_tokens(oai, [QUESTION, image_part(RED), image_part(STRIPED, "low")]) == text + 2 * N_IMAGE_TOKENS


def test_images_of_earlier_turns_stay_in_the_prompt(oai: openai.OpenAI) -> None:
    first = [{"type": "text", "text": "Look at this."}]
    history: list[Any] = [{"role": "user", "content": first}, {"role": "assistant", "content": "I see it."}]
    text = chat_tokens(oai, [QUESTION], history=history)
    history[0]["content"] = [*first, image_part(STRIPED)]
    assert chat_tokens(oai, [QUESTION, image_part(RED)], history=history) == text + 2 * N_IMAGE_TOKENS


def test_openai_chat_input_audio_reaches_the_engine(oai: openai.OpenAI) -> None:
    listen = {"type": "text", "text": "What do you hear?"}
    sound = {"type": "input_audio", "input_audio": {"data": b64(TONE_THEN_NOISE), "format": "wav"}}
    assert chat_tokens(oai, [listen, sound], "ear") == chat_tokens(oai, [listen], "ear") + N_AUDIO_TOKENS


def test_an_image_in_a_tool_message_reaches_the_engine(oai: openai.OpenAI) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "screenshot", "arguments": "{}"}}
    history: list[Any] = [
        {"role": "user", "content": "Take a screenshot."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
    ]

    def tokens(result: Any) -> int:
        messages = [*history, {"role": "tool", "tool_call_id": "c1", "content": result}]
        r = oai.chat.completions.create(model="eye", messages=messages, max_tokens=1)
        assert r.usage is not None
        return r.usage.prompt_tokens

    done = {"type": "text", "text": "done"}
    assert tokens([done, image_part(RED)]) == tokens([done]) + N_IMAGE_TOKENS


def responses_tokens(oai: openai.OpenAI, content: list[Any], model: str = "eye") -> int:
    r = oai.responses.create(
        model=model, input=[{"role": "user", "content": content}], max_output_tokens=1, store=False
    )  # type: ignore[arg-type]
    assert r.usage is not None
    return r.usage.input_tokens


def test_responses_input_image_and_input_audio_reach_the_engine(oai: openai.OpenAI) -> None:
    ask = {"type": "input_text", "text": "Describe it."}
    image = {"type": "input_image", "image_url": data_url(RED), "detail": "auto"}
    assert responses_tokens(oai, [ask, image]) == responses_tokens(oai, [ask]) + N_IMAGE_TOKENS
    # (the Responses API's own content types take no sound; the Chat Completions
    # shape is taken, and the flat one of the older type definitions)
    nested = {"type": "input_audio", "input_audio": {"data": b64(TONE_THEN_NOISE), "format": "wav"}}
    flat = {"type": "input_audio", "data": b64(TONE_THEN_NOISE), "format": "wav"}
    text = responses_tokens(oai, [ask], "ear")
    assert responses_tokens(oai, [ask, nested], "ear") == responses_tokens(oai, [ask, flat], "ear")
    assert responses_tokens(oai, [ask, nested], "ear") == text + N_AUDIO_TOKENS


def test_a_responses_file_id_is_a_clear_400(srv: Server) -> None:
    body = {"model": "eye", "input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}]}
    r = httpx.post(srv.url + "/v1/responses", json=body, timeout=60)
    assert_openai_error(r, 400, "input[0].content[0].file_id", "no files API")


def test_anthropic_images_reach_the_engine_in_messages_and_tool_results(ant: anthropic.Anthropic) -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(RED)}}
    ask = {"type": "text", "text": "What is this?"}

    def tokens(content: list[Any], history: list[Any] | None = None) -> int:
        messages = [*(history or []), {"role": "user", "content": content}]
        r = ant.messages.create(model="eye", max_tokens=1, messages=messages)  # type: ignore[arg-type]
        return r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0)

    assert tokens([ask, image]) == tokens([ask]) + N_IMAGE_TOKENS
    counted = ant.messages.count_tokens(model="eye", messages=[{"role": "user", "content": [ask, image]}])
    assert counted.input_tokens == tokens([ask]) + N_IMAGE_TOKENS
    # Claude Code's screenshot: an image in a tool result
    use = {"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}}
    history = [{"role": "user", "content": "Take a screenshot."}, {"role": "assistant", "content": [use]}]

    def result(content: list[Any]) -> list[Any]:
        return [{"type": "tool_result", "tool_use_id": "toolu_1", "content": content}]

    shot = result([{"type": "text", "text": "here"}, image])
    assert tokens(shot, history) == tokens(result([{"type": "text", "text": "here"}]), history) + N_IMAGE_TOKENS


def test_ollama_images_reach_the_engine_in_chat_and_generate(oll: ollama.Client) -> None:
    def chat(images: list[str] | None) -> int:
        messages = [{"role": "user", "content": "What is this?", "images": images}]
        r = oll.chat(model="eye", messages=messages, options={"num_predict": 1})
        return int(r.prompt_eval_count or 0)

    def generate(images: list[str] | None, prompt: str = "What is this?", raw: bool = False) -> int:
        r = oll.generate(model="eye", prompt=prompt, images=images, raw=raw, options={"num_predict": 1})
        return int(r.prompt_eval_count or 0)

    assert chat([b64(RED), b64(STRIPED)]) == chat(None) + 2 * N_IMAGE_TOKENS
    assert generate([b64(RED)]) == generate(None) + N_IMAGE_TOKENS
    # raw: the images go before the prompt, or where its [img] tags stand
    assert generate([b64(RED)], "Caption:", raw=True) == generate(None, "Caption:", raw=True) + N_IMAGE_TOKENS
    tagged = generate([b64(RED)], "Caption: [img]", raw=True)
    assert tagged == generate(None, "Caption: ", raw=True) + N_IMAGE_TOKENS


def completion(srv: Server, prompt: Any, path: str = "/completion") -> httpx.Response:
    return httpx.post(srv.url + path, json={"model": "eye", "prompt": prompt, "n_predict": 1}, timeout=60)


def test_llama_server_multimodal_data_reaches_the_engine(srv: Server) -> None:
    text = completion(srv, "A picture: ").json()["tokens_evaluated"]
    one = {"prompt_string": "A picture: <__media__>", "multimodal_data": [b64(RED)]}
    r = completion(srv, one)
    assert r.status_code == 200, r.text
    assert r.json()["tokens_evaluated"] == text + N_IMAGE_TOKENS and r.json()["prompt"] == one["prompt_string"]
    two = {"prompt_string": "A picture: <__media__><__media__>", "multimodal_data": [b64(RED), b64(STRIPED)]}
    assert completion(srv, [two]).json()["tokens_evaluated"] == text + 2 * N_IMAGE_TOKENS


# ------------------------------------------------------------------- bad media
def openai_chat_body(url: str) -> dict[str, Any]:
    return {"model": "eye", "max_tokens": 1, "messages": [{"role": "user", "content": [QUESTION, image_part_url(url)]}]}


def image_part_url(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def anthropic_body(data: str) -> dict[str, Any]:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}
    return {"model": "eye", "max_tokens": 1, "messages": [{"role": "user", "content": [image]}]}


def responses_body(url: str) -> dict[str, Any]:
    image = {"type": "input_image", "image_url": url}
    return {"model": "eye", "max_output_tokens": 1, "input": [{"role": "user", "content": [image]}]}


# (path, body of an item given as base64, how the dialect answers errors, the item's param)
Form = tuple[str, Callable[[str], dict[str, Any]], Callable[..., Any], str | None]
FORMS: list[Form] = [
    ("/v1/chat/completions", lambda d: openai_chat_body(f"data:image/png;base64,{d}"), assert_openai_error,
     "messages[0].content[1].image_url"),
    ("/v1/responses", lambda d: responses_body(f"data:image/png;base64,{d}"), assert_openai_error,
     "input[0].content[0].image_url"),
    ("/v1/messages", anthropic_body, assert_anthropic_error, None),
    ("/api/chat", lambda d: {"model": "eye", "messages": [{"role": "user", "content": "?", "images": [d]}]},
     assert_ollama_error, None),
    ("/api/generate", lambda d: {"model": "eye", "prompt": "?", "images": [d]}, assert_ollama_error, None),
    ("/completion", lambda d: {"model": "eye", "prompt": {"prompt_string": "<__media__>", "multimodal_data": [d]}},
     None, None),
]  # fmt: skip


def assert_llamacpp_error(r: httpx.Response, status: int, contains: str) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"code", "message", "type"} and err["code"] == status, err
    assert contains.lower() in err["message"].lower(), err


def refused(srv: Server, form: Form, data: str, status: int, contains: str, stream: bool = False) -> None:
    path, body, check, param = form
    r = httpx.post(srv.url + path, json={**body(data), "stream": stream}, timeout=60)
    assert r.headers["content-type"].startswith("application/json"), r.text
    if check is None:
        assert_llamacpp_error(r, status, contains)
    elif check is assert_openai_error:
        check(r, status, param if status == 400 else None, contains)
    else:
        check(r, status, contains)


BAD = [
    ("not base64 @@", "not valid base64"),
    (b64(b"<html>hello</html>"), "neither an image"),
    (b64(BROKEN), "does not decode"),
    (b64(BOMB), "declares 100000 × 100000 pixels"),
    (b64(TONE_THEN_NOISE), "sound"),  # (an image field holding a sound; Ollama's, llama-server's: to "eye")
]


@pytest.mark.parametrize("form", FORMS, ids=[f[0] for f in FORMS])
@pytest.mark.parametrize(("data", "contains"), BAD, ids=["base64", "html", "undecodable", "bomb", "sound"])
def test_bad_media_is_a_400_in_each_dialects_shape(srv: Server, form: Form, data: str, contains: str) -> None:
    refused(srv, form, data, 400, contains, stream=form[0] != "/completion")


def test_a_sound_where_an_image_goes_is_refused(srv: Server) -> None:
    r = httpx.post(srv.url + "/v1/messages", json=anthropic_body(b64(TONE_THEN_NOISE)), timeout=60)
    assert_anthropic_error(r, 400, "holds a sound (WAV), not an image")
    r = httpx.post(srv.url + "/api/generate", json={"model": "eye", "prompt": "?", "images": [b64(TONE_THEN_NOISE)]})
    assert_ollama_error(r, 400, "takes no sound")


def test_a_data_url_of_another_type_is_refused(srv: Server) -> None:
    r = httpx.post(srv.url + "/v1/chat/completions", json=openai_chat_body("data:text/html;base64,PGI+"), timeout=60)
    assert_openai_error(r, 400, "messages[0].content[1].image_url", "type 'text/html'")
    r = httpx.post(srv.url + "/v1/responses", json=responses_body("data:text/html,<b>hi</b>"), timeout=60)
    assert_openai_error(r, 400, "input[0].content[0].image_url", "expected an image")


@pytest.mark.parametrize("form", FORMS, ids=[f[0] for f in FORMS])
def test_an_image_to_a_model_without_vision_keeps_images_not_supported(srv: Server, form: Form) -> None:
    path, body, _, _ = form
    r = httpx.post(srv.url + path, json={**body(b64(RED)), "model": "ear"}, timeout=60)
    assert r.status_code == 400 and "takes no images" in r.text and "'ear'" in r.text, r.text
    if path.startswith("/v1/") and path != "/v1/messages":
        assert r.json()["error"]["code"] == "images_not_supported"


def test_sound_to_a_model_without_audio_is_audio_not_supported(srv: Server) -> None:
    sound = {"type": "input_audio", "input_audio": {"data": b64(TONE_THEN_NOISE), "format": "wav"}}
    body = {"model": "eye", "messages": [{"role": "user", "content": [sound]}]}
    r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60)
    err = assert_openai_error(r, 400, "messages", "takes no sound")
    assert err["code"] == "audio_not_supported"


def test_more_media_than_max_images_is_refused(srv: Server) -> None:
    many = [image_part(RED)] * (MAX_IMAGES + 1)
    body = {"model": "eye", "messages": [{"role": "user", "content": many}]}
    r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60)
    assert assert_openai_error(r, 400, "messages", "--max-images")["code"] == "too_many_images"
    body = {"model": "eye", "messages": [{"role": "user", "content": "?", "images": [b64(RED)] * (MAX_IMAGES + 1)}]}
    assert_ollama_error(httpx.post(srv.url + "/api/chat", json=body, timeout=60), 400, "at most 4")


def test_a_body_over_the_limit_is_a_413_in_the_dialects_shape(srv: Server) -> None:
    big = b64(b"\x00" * (MAX_BODY + 10))
    r = httpx.post(srv.url + "/v1/messages", json=anthropic_body(big), timeout=60)
    assert_anthropic_error(r, 413, "", type_="request_too_large")
    r = httpx.post(srv.url + "/api/chat", json=FORMS[3][1](big), timeout=60)
    assert_ollama_error(r, 413)


def test_media_outside_user_and_tool_messages_and_infill_are_refused(srv: Server) -> None:
    messages = [{"role": "system", "content": [image_part(RED)]}, {"role": "user", "content": "?"}]
    body = {"model": "eye", "messages": messages}
    r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60)
    assert_openai_error(r, 400, "messages[0].content[0].type", "not in a system message")
    one = {"prompt_string": "<__media__>", "multimodal_data": [b64(RED)]}
    r = httpx.post(srv.url + "/infill", json={"model": "eye", "input_prefix": "a", "prompt": one}, timeout=60)
    assert_llamacpp_error(r, 400, "takes no media")
    r = completion(srv, {"prompt_string": "no marker", "multimodal_data": [b64(RED)]})
    assert_llamacpp_error(r, 400, "0 media marker(s)")


def test_a_remote_url_is_refused_by_default_saying_how_to_enable_it(srv: Server) -> None:
    r = httpx.post(srv.url + "/v1/chat/completions", json=openai_chat_body("https://example.com/cat.png"), timeout=60)
    err = assert_openai_error(r, 400, "messages[0].content[1].image_url", "--allow-media-urls")
    assert err["code"] == "media_urls_off" and "data URL" in err["message"]
    image = {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}
    body = {"model": "eye", "max_tokens": 1, "messages": [{"role": "user", "content": [image]}]}
    r = httpx.post(srv.url + "/v1/messages", json=body, timeout=60)
    assert_anthropic_error(r, 400, "--allow-media-urls")


# ---------------------------------------------------------------- the sniffing
def test_image_headers_give_their_size_before_any_decoding() -> None:
    assert sniff(RED) == ("image", "PNG") and image_size(RED, "PNG") == (56, 56)
    jpeg = b"\xff\xd8\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00" + b"\x00" * 9
    jpeg += b"\xff\xc0" + struct.pack(">HBHH", 17, 8, 300, 400) + b"\x03" + b"\x00" * 9
    assert sniff(jpeg) == ("image", "JPEG") and image_size(jpeg, "JPEG") == (400, 300)
    gif = b"GIF89a" + struct.pack("<HH", 640, 480) + b"\x00" * 8
    assert image_size(gif, "GIF") == (640, 480)
    bmp = b"BM" + b"\x00" * 12 + struct.pack("<Iii", 40, 320, -200) + b"\x00" * 8
    assert image_size(bmp, "BMP") == (320, 200)
    webp = b"RIFF\x00\x00\x00\x00WEBPVP8X" + b"\x00" * 8 + (99).to_bytes(3, "little") + (49).to_bytes(3, "little")
    assert sniff(webp) == ("image", "WebP") and image_size(webp, "WebP") == (100, 50)
    assert sniff(TONE_THEN_NOISE) == ("audio", "WAV") and sniff(b"ID3\x03") == ("audio", "MP3")
    side = int(MAX_IMAGE_PIXELS**0.5)
    assert check_item(Media("image", png_declaring(side, side), field="f")) == side * side
    for bomb in (png_declaring(side + 1, side), BOMB, gif[:6] + struct.pack("<HH", 65535, 65535) + gif[10:]):
        with pytest.raises(ValueError, match="declares"):
            check_item(Media("image", bomb, field="messages[0]"))


def test_a_refused_bomb_leaves_the_server_serving(srv: Server) -> None:
    refused(srv, FORMS[0], b64(BOMB), 400, "8192 × 8192")
    r = httpx.post(srv.url + "/v1/chat/completions", json=openai_chat_body(data_url(RED)), timeout=60)
    assert r.status_code == 200, r.text
