"""ONNX's Attention operator, called once: a one-node model built per call and run as it is.

    reference_attention(Q, K, V, attn_mask=None, nonpad_kv_seqlen=None, **attributes)   # onnx.reference
    onnxruntime_attention(Q, K, V, attn_mask=None, nonpad_kv_seqlen=None, **attributes) # ONNX Runtime, CPU

NumPy arrays in and out; the attributes are the operator's own (is_causal, scale, softcap,
left_window_size, right_window_size, qk_matmul_output_mode...). Both return Y, or (Y,
qk_matmul_output) when ``qk_matmul_output_mode`` is given. The model imports opset `OPSET`, the
newest onnx 1.23 defines, where Attention resolves to its version 25.

This file needs NumPy and onnx (and onnxruntime) only, nothing of attnspec: the atlas'
reproducers paste it whole, so that each stays standalone.
"""

OPSET = 28

#: the operator's optional inputs, in their positions
_INPUTS = ("Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen")


def attention_model(feeds, attributes, opset=OPSET):
    """The one-node model computing Attention on ``feeds`` (name -> array) with ``attributes``."""
    import numpy as np
    from onnx import helper

    last = max(_INPUTS.index(name) for name in feeds)
    inputs = [name if name in feeds else "" for name in _INPUTS[: last + 1]]
    weights = attributes.get("qk_matmul_output_mode") is not None
    outputs = ["Y", "", "", "qk_matmul_output"] if weights else ["Y"]
    node = helper.make_node("Attention", inputs, outputs, **attributes)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(feeds["Q"].dtype))
    declared = [
        helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(np.dtype(feeds[name].dtype)), feeds[name].shape
        )
        for name in inputs
        if name
    ]
    results = [helper.make_tensor_value_info(name, elem, None) for name in outputs if name]
    graph = helper.make_graph([node], "attention", declared, results)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return model


def _feeds(Q, K, V, attn_mask, nonpad_kv_seqlen):
    feeds = {"Q": Q, "K": K, "V": V}
    if attn_mask is not None:
        feeds["attn_mask"] = attn_mask
    if nonpad_kv_seqlen is not None:
        feeds["nonpad_kv_seqlen"] = nonpad_kv_seqlen
    return feeds


def _outputs(found, attributes):
    return tuple(found) if attributes.get("qk_matmul_output_mode") is not None else found[0]


def reference_attention(Q, K, V, attn_mask=None, nonpad_kv_seqlen=None, **attributes):
    """Attention by onnx's reference evaluator (`onnx.reference.ReferenceEvaluator`)."""
    from onnx.reference import ReferenceEvaluator

    feeds = _feeds(Q, K, V, attn_mask, nonpad_kv_seqlen)
    session = ReferenceEvaluator(attention_model(feeds, attributes))
    return _outputs(session.run(None, feeds), attributes)


def onnxruntime_attention(Q, K, V, attn_mask=None, nonpad_kv_seqlen=None, **attributes):
    """Attention by ONNX Runtime's CPUExecutionProvider."""
    import onnxruntime

    feeds = _feeds(Q, K, V, attn_mask, nonpad_kv_seqlen)
    model = attention_model(feeds, attributes)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return _outputs(session.run(None, feeds), attributes)
