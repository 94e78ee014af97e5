# why: argparse accepts a unique prefix: --network_di 8 is --network_dim 8 (the LoRA has rank 8; unset would be 4).
# lora rank: 8
# (the harness config as a command line; @NAME@ placeholders and the script path are filled in by tests/integration/test_accepted_real.py)
accelerate launch --cpu --num_processes 1 --num_machines 1 --mixed_precision no --dynamo_backend no \
  train_network.py \
  --pretrained_model_name_or_path "@MODEL@" --tokenizer_cache_dir "@TOKCACHE@" \
  --train_data_dir "@DATA@" --output_dir "@OUT@" --output_name probe --caption_extension .txt \
  --resolution 64,64 --random_crop --sdpa \
  --network_module networks.lora --network_alpha 1 \
  --optimizer_type AdamW --learning_rate 0.0001 --train_batch_size 1 --max_train_steps 1 \
  --max_data_loader_n_workers 0 --mixed_precision no --seed 1 \
  --network_di 8
