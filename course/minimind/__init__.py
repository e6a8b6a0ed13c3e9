"""A tiny, self-contained MiniMind: the oracle every lesson aligns with."""
from .config import TINY_HIDDEN_SIZE, TINY_NUM_HIDDEN_LAYERS, MiniMindConfig
from .dataset import TINY_CORPUS, JsonlTexts, PretrainDataset, read_jsonl_texts
from .model import IGNORE_INDEX, CausalLMOutput, MiniMindForCausalLM
from .sft import SFTDataset, render_chat
from .tokenizer import ByteTokenizer, load_tokenizer
from .trainer_utils import get_lr, setup_seed

__all__ = ["MiniMindConfig", "MiniMindForCausalLM", "CausalLMOutput", "IGNORE_INDEX", "ByteTokenizer",
           "PretrainDataset", "JsonlTexts", "read_jsonl_texts", "load_tokenizer", "TINY_CORPUS", "TINY_HIDDEN_SIZE",
           "TINY_NUM_HIDDEN_LAYERS", "get_lr", "setup_seed", "SFTDataset", "render_chat"]
