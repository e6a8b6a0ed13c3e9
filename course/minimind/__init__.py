"""A tiny, self-contained MiniMind: the oracle every lesson aligns with."""
from .config import TINY_HIDDEN_SIZE, TINY_NUM_HIDDEN_LAYERS, MiniMindConfig
from .dataset import TINY_CORPUS, PretrainDataset, read_jsonl_texts
from .model import IGNORE_INDEX, CausalLMOutput, MiniMindForCausalLM
from .tokenizer import ByteTokenizer
from .trainer_utils import get_lr, setup_seed

__all__ = ["MiniMindConfig", "MiniMindForCausalLM", "CausalLMOutput", "IGNORE_INDEX", "ByteTokenizer",
           "PretrainDataset", "read_jsonl_texts", "TINY_CORPUS", "TINY_HIDDEN_SIZE",
           "TINY_NUM_HIDDEN_LAYERS", "get_lr", "setup_seed"]
