"""Prepared token folders: `paralleljob data prepare` reads a corpus through a Hugging Face tokenizer and writes
the folder whose layout `paralleljob_contract.dataset` defines. Needs the `data` extra (tokenizers, pyarrow).
"""
