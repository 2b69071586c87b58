"""R5: what a stop keeps of a streamed answer (workers/stopped.py's PartialReplies)."""

from __future__ import annotations

from uuid import uuid4

from langchain_core.messages import AIMessageChunk
from langchain_core.outputs import ChatGenerationChunk

from workers.stopped import MODEL_NODE, STOPPED_KEY, PartialReplies

MODEL_CALL = {"langgraph_node": MODEL_NODE, "langgraph_checkpoint_ns": "model:1"}


def _stream(replies: PartialReplies, chunks: list[AIMessageChunk]) -> None:
    run_id = uuid4()
    replies.on_chat_model_start(None, [], run_id=run_id, metadata=MODEL_CALL)
    for chunk in chunks:
        replies.on_llm_new_token(
            str(chunk.content), chunk=ChatGenerationChunk(message=chunk), run_id=run_id
        )


def test_r5_partial_reply_is_the_sum_of_the_streamed_chunks() -> None:
    """R5: the stopped answer equals the streamed chunks added in order (text, id, usage)."""
    chunks = [AIMessageChunk(content=f"t{i:04d} ", id="msg-1") for i in range(200)]
    chunks[-1] = AIMessageChunk(
        content="t0199 ",
        id="msg-1",
        usage_metadata={"input_tokens": 3, "output_tokens": 200, "total_tokens": 203},
        response_metadata={"model_name": "m", "finish_reason": "stop"},
    )
    replies = PartialReplies()
    _stream(replies, chunks)
    summed = chunks[0]
    for chunk in chunks[1:]:
        summed = summed + chunk
    kept = replies.partial()
    assert kept is not None
    assert kept.content == summed.text == "".join(f"t{i:04d} " for i in range(200))
    assert kept.id == "msg-1"
    assert kept.usage_metadata == summed.usage_metadata
    assert kept.response_metadata == {"model_name": "m", STOPPED_KEY: True}


def test_r5_partial_reply_is_the_newest_unfinished_call_with_text() -> None:
    """R5: a finished call is not kept; a later call that streamed nothing yet is skipped."""
    replies = PartialReplies()
    _stream(replies, [AIMessageChunk(content="first ")])
    done = uuid4()
    replies.on_chat_model_start(None, [], run_id=done, metadata=MODEL_CALL)
    replies.on_llm_new_token("gone", chunk=None, run_id=done)
    replies.on_llm_end(None, run_id=done)
    replies.on_chat_model_start(None, [], run_id=uuid4(), metadata=MODEL_CALL)  # no token yet
    kept = replies.partial()
    assert kept is not None and kept.content == "first "
    assert PartialReplies().partial() is None
