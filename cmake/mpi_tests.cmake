# Multi-process tests of src/dist (tests/dist/mpi), labelled "mpi":
#   dist_mpi_np2, dist_mpi_np4  test_dist_mpi (GoogleTest inside every rank) under
#                               mpirun with 2 and 4 ranks (4 oversubscribe 2 cores)
#   test_dist_fault             starts dist_fault under mpirun with a hung or
#                               killed rank and checks the job ends, naming it
# As root, OpenMPI needs OMPI_ALLOW_RUN_AS_ROOT*. The single-copy mechanism
# (CMA) is off: containers usually forbid the ptrace it needs.
# NK_TIME_SCALE: the scripts' own time limits scale as the tests' do (nk_timeout).
set(NK_MPI_ENV OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1 NK_TIME_SCALE=${nk_time_scale})
if(NK_SANITIZE)
  # OpenMPI leaves allocations behind at MPI_Finalize from plugins it has
  # unloaded by exit, which no LSan suppression can name (tests/sanitize/lsan.supp);
  # every other ASan and UBSan check stays on in these tests.
  list(APPEND NK_MPI_ENV ASAN_OPTIONS=halt_on_error=1:detect_leaks=0)
endif()

# test_<name>: GoogleTest in every rank, from tests/<dir>/*_mpi.cc (and any
# further sources), linked with `lib`, run as <name>_np2 and <name>_np4
# (4 oversubscribe 2 cores).
function(nk_mpi_gtest name dir lib timeout)
  file(GLOB srcs CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/${dir}/*_mpi.cc)
  add_executable(test_${name} ${srcs} ${ARGN})
  target_link_libraries(test_${name} PRIVATE ${lib} nk_test_paths GTest::gtest)
  target_include_directories(test_${name} PRIVATE ${CMAKE_SOURCE_DIR}/tests)
  set_target_properties(test_${name} PROPERTIES UNITY_BUILD OFF)  # as test_<sub> (CMakeLists.txt)
  foreach(np 2 4)
    add_test(NAME ${name}_np${np}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
                     ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_${name}> ${MPIEXEC_POSTFLAGS})
    nk_timeout(t ${timeout})
    set_tests_properties(${name}_np${np} PROPERTIES LABELS mpi TIMEOUT ${t}
                         ENVIRONMENT "${NK_MPI_ENV}")
  endforeach()
endfunction()

nk_mpi_gtest(dist_mpi dist/mpi nk_dist 120)

add_executable(dist_fault ${CMAKE_SOURCE_DIR}/tests/dist/mpi/fault_main.cc)
target_link_libraries(dist_fault PRIVATE nk_dist)
add_executable(test_dist_fault ${CMAKE_SOURCE_DIR}/tests/dist/mpi/timeout_driver.cc)
target_link_libraries(test_dist_fault PRIVATE nk_core GTest::gtest_main)
target_include_directories(test_dist_fault PRIVATE ${CMAKE_SOURCE_DIR}/tests)
target_compile_definitions(test_dist_fault PRIVATE NK_MPIEXEC="${MPIEXEC_EXECUTABLE}"
                                                   NK_DIST_FAULT="$<TARGET_FILE:dist_fault>")
add_dependencies(test_dist_fault dist_fault)
nk_timeout(t 60)
# The driver starts dist_fault under mpirun: the same ASan options as the other MPI tests.
set(nk_fault_env "OMP_NUM_THREADS=1")
if(NK_SANITIZE)
  set(nk_fault_env "ASAN_OPTIONS=halt_on_error=1:detect_leaks=0")
endif()
gtest_discover_tests(test_dist_fault DISCOVERY_TIMEOUT 60 PROPERTIES LABELS mpi TIMEOUT ${t}
                     ENVIRONMENT "${nk_fault_env}")

# Multi-process tests of src/parallel (tests/parallel/mpi), labelled "mpi":
#   parallel_mpi_np2, parallel_mpi_np4   data parallel against one process
#                                        (GoogleTest inside every rank)
#   tensor_parallel_mpi_np2, _np4, _np8  tensor (and sequence) and pipeline parallel,
#                                        alone, together and with data parallel
#                                        (and ZeRO-1), against one process;
#                                        resharding checkpoints; the cached
#                                        decode under TP2 (generation)
#                                        (tests/parallel/tensor_parallel)
nk_mpi_gtest(parallel_mpi parallel/mpi nk_train 300)
nk_mpi_gtest(tensor_parallel_mpi parallel/tensor_parallel nk_train 600
             ${CMAKE_SOURCE_DIR}/tests/parallel/mpi/main_mpi.cc)
target_include_directories(test_tensor_parallel_mpi PRIVATE ${CMAKE_SOURCE_DIR}/tests/parallel/mpi)
target_link_libraries(test_tensor_parallel_mpi PRIVATE nk_infer)  # the decode (tp_decode_mpi.cc)
# DP2 × TP2 × PP2: 8 ranks on 2 cores (labelled many_ranks as well).
add_test(NAME tensor_parallel_mpi_np8
         COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 8 --oversubscribe
                 ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_tensor_parallel_mpi> ${MPIEXEC_POSTFLAGS})
nk_timeout(t 600)
set_tests_properties(tensor_parallel_mpi_np8 PROPERTIES LABELS "mpi;many_ranks" TIMEOUT ${t}
                     ENVIRONMENT "${NK_MPI_ENV}")

# `nekton train` under mpirun and through --nproc (labelled "mpi"): only rank 0
# prints the step log; an impossible batch is refused before mpirun starts.
set(NK_TRAIN_CLI_ARGS model.preset=gpt-tiny model.n_layer=2 model.d_model=64 model.n_head=4
    model.d_ff=128 data.path=${CMAKE_SOURCE_DIR}/README.md train.dtype=f32 train.micro_batch=2
    train.seq_len=32 train.global_batch=8 train.steps=3 train.val_every=0 train.peak_tflops=1
    parallel.bucket_mb=0.05)
add_test(NAME train_cli_mpirun_np2
         COMMAND sh -c "rm -rf \"$0\" && exec \"$@\"" ${CMAKE_BINARY_DIR}/train_cli_mpirun
                 ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe
                 $<TARGET_FILE:nekton> train ${NK_TRAIN_CLI_ARGS}
                 train.out_dir=${CMAKE_BINARY_DIR}/train_cli_mpirun)
add_test(NAME train_cli_nproc2
         COMMAND sh -c "rm -rf \"$0\" && exec \"$@\"" ${CMAKE_BINARY_DIR}/train_cli_nproc
                 $<TARGET_FILE:nekton> train --nproc 2 ${NK_TRAIN_CLI_ARGS}
                 train.out_dir=${CMAKE_BINARY_DIR}/train_cli_nproc)
nk_timeout(t 120)
set_tests_properties(train_cli_mpirun_np2 train_cli_nproc2 PROPERTIES
                     LABELS mpi TIMEOUT ${t} ENVIRONMENT "${NK_MPI_ENV}"
                     PASS_REGULAR_EXPRESSION "data parallel: world 2.*step +3/3 .*saved .*model"
                     FAIL_REGULAR_EXPRESSION "step +3/3.*step +3/3;rror")
# Tensor + sequence parallel through the command line: the layout in the log,
# the whole model exported by rank 0.
add_test(NAME train_cli_tp2_sp
         COMMAND sh -c "rm -rf \"$0\" && exec \"$@\"" ${CMAKE_BINARY_DIR}/train_cli_tp
                 ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe
                 $<TARGET_FILE:nekton> train ${NK_TRAIN_CLI_ARGS} model.vocab_size=264
                 parallel.tp=2 parallel.sp=true train.out_dir=${CMAKE_BINARY_DIR}/train_cli_tp)
nk_timeout(t 120)
set_tests_properties(train_cli_tp2_sp PROPERTIES
                     LABELS mpi TIMEOUT ${t} ENVIRONMENT "${NK_MPI_ENV}"
                     PASS_REGULAR_EXPRESSION
                     "model parallel: world 2 = tp 2.*sequence parallel.*step +3/3 .*saved .*model"
                     FAIL_REGULAR_EXPRESSION "step +3/3.*step +3/3;rror")
# Pipeline x tensor parallel through the command line, validation included.
add_test(NAME train_cli_pp2_tp2
         COMMAND sh -c "rm -rf \"$0\" && exec \"$@\"" ${CMAKE_BINARY_DIR}/train_cli_pp
                 ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 --oversubscribe
                 $<TARGET_FILE:nekton> train ${NK_TRAIN_CLI_ARGS} model.vocab_size=264
                 parallel.tp=2 parallel.pp=2 train.val_every=3
                 train.out_dir=${CMAKE_BINARY_DIR}/train_cli_pp)
nk_timeout(t 120)
set_tests_properties(train_cli_pp2_tp2 PROPERTIES
                     LABELS mpi TIMEOUT ${t} ENVIRONMENT "${NK_MPI_ENV}"
                     PASS_REGULAR_EXPRESSION
                     "pipeline stage 0 of 2: layers \\[0, 1\\), embedding .1F1B.*step +3/3 .*val .*saved .*model"
                     FAIL_REGULAR_EXPRESSION "step +3/3.*step +3/3;rror")
# train.profile on a pipeline: rank 0 prints every rank's table under its
# heading (the stages run different kernels: the loss only on the last; a
# table printed by its own rank would interleave with the others' lines),
# and alone writes profile.json, with its rank.
add_test(NAME train_cli_pp2_profile
         COMMAND sh -c "rm -rf \"$0\" && out=$(\"$@\" 2>&1); rc=$?; printf '%s\\n' \"$out\"; \
table() { printf '%s\\n' \"$out\" | sed -n \"/profile (rank $1 of 2, /,/outside kernels/p\"; } && \
test $rc = 0 && table 0 | grep -q linear_backward && ! table 0 | grep -q cross_entropy && \
table 1 | grep -q cross_entropy_forward_backward && \
grep -q '\"rank\": 0' \"$0/profile.json\" && test $(ls \"$0\" | grep -c profile) = 1"
                 ${CMAKE_BINARY_DIR}/train_cli_pp_profile
                 ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe
                 $<TARGET_FILE:nekton> train ${NK_TRAIN_CLI_ARGS} parallel.pp=2 train.profile=true
                 train.out_dir=${CMAKE_BINARY_DIR}/train_cli_pp_profile)
nk_timeout(t 120)
set_tests_properties(train_cli_pp2_profile PROPERTIES LABELS mpi TIMEOUT ${t}
                     ENVIRONMENT "${NK_MPI_ENV}")
# Context parallel through the command line: the layout and each rank's
# chunks in the log, validation included, the model exported by rank 0.
add_test(NAME train_cli_cp2
         COMMAND sh -c "rm -rf \"$0\" && exec \"$@\"" ${CMAKE_BINARY_DIR}/train_cli_cp
                 ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe
                 $<TARGET_FILE:nekton> train ${NK_TRAIN_CLI_ARGS} parallel.cp=2 train.val_every=3
                 train.out_dir=${CMAKE_BINARY_DIR}/train_cli_cp)
nk_timeout(t 120)
set_tests_properties(train_cli_cp2 PROPERTIES
                     LABELS mpi TIMEOUT ${t} ENVIRONMENT "${NK_MPI_ENV}"
                     PASS_REGULAR_EXPRESSION
                     "context parallel: world 2 = tp 1 .* cp 2 .*chunks 0 and 3 of 4.*step +3/3 .*val .*saved .*model"
                     FAIL_REGULAR_EXPRESSION "step +3/3.*step +3/3;rror")
# Context × pipeline parallel through the command line: both layouts in
# the log, validation included, the model exported by rank 0.
add_test(NAME train_cli_cp2_pp2
         COMMAND sh -c "rm -rf \"$0\" && exec \"$@\"" ${CMAKE_BINARY_DIR}/train_cli_cp_pp
                 ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 --oversubscribe
                 $<TARGET_FILE:nekton> train ${NK_TRAIN_CLI_ARGS} parallel.cp=2 parallel.pp=2
                 train.val_every=3 train.out_dir=${CMAKE_BINARY_DIR}/train_cli_cp_pp)
nk_timeout(t 120)
set_tests_properties(train_cli_cp2_pp2 PROPERTIES
                     LABELS mpi TIMEOUT ${t} ENVIRONMENT "${NK_MPI_ENV}"
                     PASS_REGULAR_EXPRESSION
                     "context parallel: world 4 = tp 1 × cp 2 × dp 1 × pp 2.*pipeline stage 0 of 2: layers \\[0, 1\\), embedding .1F1B.*step +3/3 .*val .*saved .*model"
                     FAIL_REGULAR_EXPRESSION "step +3/3.*step +3/3;rror")
add_test(NAME train_cli_nproc_bad_batch
         COMMAND $<TARGET_FILE:nekton> train --nproc 3 ${NK_TRAIN_CLI_ARGS}
                 train.out_dir=${CMAKE_BINARY_DIR}/train_cli_bad)
nk_timeout(t 60)
set_tests_properties(train_cli_nproc_bad_batch PROPERTIES LABELS mpi TIMEOUT ${t}
                     ENVIRONMENT "${NK_MPI_ENV}"
                     PASS_REGULAR_EXPRESSION
                     "train.global_batch = 8 is not a multiple of data-parallel size × train.micro_batch = 3 × 2 = 6")

# Shell-script tests of `nekton train` under mpirun (tests/apps/mpi), labelled "mpi":
#   train_multihost_netns    2 ranks on two "hosts" (network namespaces joined by
#                            veth, TCP only) match one host; skipped where namespaces
#                            cannot be made (needs root / CAP_SYS_ADMIN)
#   train_rank_kill_resume   a SIGKILLed rank ends the job, named (a stopped one through
#                            rank 0's timeout); the rerun resumes from the newest
#                            checkpoint on the uninterrupted curve
#   train_reshard_cli        a 4-rank ZeRO-1 checkpoint resumed by one process and by
#                            FSDP over 2 ranks, on the uninterrupted run's losses
#   train_sigterm_resume     SIGTERM to mpirun: a 2-rank FSDP run saves a sharded
#                            checkpoint and stops; the rerun equals an unbroken run
add_test(NAME train_multihost_netns
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/apps/mpi/multihost_netns.sh ${CMAKE_SOURCE_DIR}
                 ${CMAKE_BINARY_DIR})
add_test(NAME train_rank_kill_resume
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/apps/mpi/rank_kill_resume.sh ${CMAKE_SOURCE_DIR}
                 ${CMAKE_BINARY_DIR})
add_test(NAME train_reshard_cli
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/apps/mpi/reshard_cli.sh ${CMAKE_SOURCE_DIR}
                 ${CMAKE_BINARY_DIR})
add_test(NAME train_sigterm_resume
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/apps/mpi/sigterm_resume.sh ${CMAKE_SOURCE_DIR}
                 ${CMAKE_BINARY_DIR})
nk_timeout(t 300)
set_tests_properties(train_multihost_netns train_rank_kill_resume train_reshard_cli
                     train_sigterm_resume PROPERTIES
                     LABELS mpi TIMEOUT ${t} ENVIRONMENT "${NK_MPI_ENV}")
set_tests_properties(train_multihost_netns PROPERTIES SKIP_REGULAR_EXPRESSION "SKIPPED:")

# `nekton train` under a real Slurm (tests/apps/mpi/slurm_srun.sh, labelled
# "mpi"): the script starts a one-node cluster of its own (munged, slurmctld,
# slurmd on 127.0.0.1; Debian's slurm-wlm and munge) and stops it; srun -n 2
# --mpi=pmix equals mpirun under DP2 and TP2, and a job stopped by scancel
# --signal=TERM resumes exactly when requeued. Skipped where Slurm cannot start.
add_test(NAME train_slurm_srun
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/apps/mpi/slurm_srun.sh ${CMAKE_SOURCE_DIR}
                 ${CMAKE_BINARY_DIR})
nk_timeout(t 400)
set_tests_properties(train_slurm_srun PROPERTIES LABELS mpi TIMEOUT ${t}
                     ENVIRONMENT "${NK_MPI_ENV}" SKIP_REGULAR_EXPRESSION "SKIPPED:")

# `nekton autoconfig` (tests/apps/mpi/autoconfig_ranks.sh, labelled "mpi"): on
# 2 ranks of a 2-layer GPT-2 it runs 6 layouts spread over its ranking, each
# measured, and the --out recipe (the measured best) trains; a run past
# --timeout is killed and reported; bad flags and keys are refused by name.
# How close its predictions come is timing: bench/run_autoconfig_bench.sh.
# Its runs use 2 ranks on both cores: it runs alone (PROCESSORS 2).
add_test(NAME autoconfig_ranks
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/apps/mpi/autoconfig_ranks.sh ${CMAKE_SOURCE_DIR}
                 ${CMAKE_BINARY_DIR})
nk_timeout(t 300)
set_tests_properties(autoconfig_ranks PROPERTIES LABELS mpi TIMEOUT ${t} PROCESSORS 2
                     ENVIRONMENT "${NK_MPI_ENV}" SKIP_REGULAR_EXPRESSION "SKIPPED:")

# `nekton autoconfig`'s search of parallel.cp_comm_type
# (tests/apps/mpi/autoconfig_cp_comm.sh, labelled "mpi"): every type at cp 2
# and 4 of 2 nodes x 2 ranks, their override lines loaded back, a type the
# user gives kept, and on 2 ranks 9 measured cp 2 layouts each training the
# type its line names. Its runs use both cores: it runs alone (PROCESSORS 2).
add_test(NAME autoconfig_cp_comm
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/apps/mpi/autoconfig_cp_comm.sh ${CMAKE_SOURCE_DIR}
                 ${CMAKE_BINARY_DIR})
nk_timeout(t 400)
set_tests_properties(autoconfig_cp_comm PROPERTIES LABELS mpi TIMEOUT ${t} PROCESSORS 2
                     ENVIRONMENT "${NK_MPI_ENV}" SKIP_REGULAR_EXPRESSION "SKIPPED:")

# `nekton curate` under mpirun (tests/apps/mpi/curate_ranks.sh), labelled "mpi":
# 1, 2 and 4 ranks write the same bytes; a SIGKILLed rank ends the job and the
# rerun resumes to them; settings that run on one process only are refused.
add_test(NAME curate_ranks
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/apps/mpi/curate_ranks.sh ${CMAKE_SOURCE_DIR}
                 ${CMAKE_BINARY_DIR})
nk_timeout(t 300)
set_tests_properties(curate_ranks PROPERTIES LABELS mpi TIMEOUT ${t} ENVIRONMENT "${NK_MPI_ENV}")

# `nekton finetune` and `nekton align` over several processes against one
# (tests/apps/mpi), labelled "mpi": every step's loss (align: its figures) and
# the exported weights within 1e-5.
#   finetune_ranks   packed SFT rows under DP over 2 and 4 ranks, ZeRO-1, FSDP,
#                    TP2 and TP2+SP, CP2 (ring and all-to-all), CP2xDP2,
#                    CP2xTP2+SP, unpacked rows; parallel.pp and a2a with
#                    indivisible heads refused
#   moe_ranks        mixtral-tiny under DP over 2 and 4 ranks, ZeRO-1, FSDP,
#                    EP2, EP2xDP2, EP2 with full recompute and a capacity
#                    factor, ZeRO-1 under EP2 and EP2xDP2, PP2, DP2xPP2, EP2
#                    with PP2, PP2 VP2 (interleaved) and EP2 x PP2 VP2, FSDP
#                    under EP2 and EP2xDP2, bf16 masters under EP2 and ZeRO-1
#                    EP2xDP2 (against DP2 in bf16), ZeRO-1 and FSDP under
#                    EP2xPP2; EP2,
#                    PP2, EP2xPP2 (and ZeRO-1), PP2 VP2, EP2xDP2 ZeRO-1 and
#                    FSDP checkpoints resumed on one process
#   moe_tp_ranks     mixtral-tiny and qwen2-moe-tiny under TP2 (and with SP),
#                    EP2xTP2 (experts split over tp as well); an EP2xTP2
#                    checkpoint resumed on one process; parallel.etp other
#                    than 1 and tp refused
#   moe_cp_ranks     mixtral-tiny, qwen2-moe-tiny and a DeepSeek-style model
#                    (sequence-wise balancing loss, aux-loss-free biases)
#                    under CP2, CP2xEP2 (2 and 4 ranks), CP2xPP2 (and VP2),
#                    CP2 with full recompute, CP2xTP2 (etp tp and 1): losses,
#                    weights and MoE figures; finetune on packed rows under
#                    CP2 and CP2xEP2, LoRA on the experts under CP2; CP2xEP2
#                    checkpoints both ways; a capacity factor under cp refused
#   moe_etp_ranks    mixtral-tiny and qwen2-moe-tiny with whole experts under
#                    TP2 (parallel.etp=1: the MoE layers' tokens split over
#                    tp), with SP, EP2 over the tp ranks, EP2xDP2, PP2,
#                    ZeRO-1; checkpoints both ways; capacity factor refused
#   moe_etp_split_ranks  mixtral-tiny and qwen2-moe-tiny with each expert split
#                    over etp < tp ranks (TP4 ETP2: the expert-tp groups split
#                    the tokens), with SP, EP2, ZeRO-1 and EP2xDP2 (8 ranks);
#                    a TP4 ETP2 checkpoint resumed under TP4 ETP4 and TP2
#                    ETP1; etp not dividing tp refused
#   align_ranks      DPO over 2 and 4 ranks, ZeRO-1, FSDP, TP2, DP2xTP2, PP2
#                    (with DP2, TP2, interleaved), SP, CP2; copy reference,
#                    KTO, SimPO, reward models; the same reference_logps.json;
#                    CP with PP refused
#   moe_align_ranks  mixtral-tiny aligned under EP2 (with DP2, TP2, PP2,
#                    ZeRO-1, FSDP): DPO, copy reference, KTO, LoRA; GRPO,
#                    PPO, LoRA GRPO, resumed from EP2 on one process; GRPO
#                    under TP2 alone (generated from the split policy)
#   peft_finetune_ranks  LoRA (with dropout) over 2 and 4 ranks, ZeRO-1, FSDP;
#                    QLoRA under DP2, ZeRO-1, FSDP and resumed; IA3, bottleneck
#                    adapters, p-tuning; the PEFT adapter too
#   peft_model_parallel_ranks  LoRA under TP2, TP2+SP, TP2xDP2, PP2, TP2xPP2
#                    (resumed under TP2 and on one process), with dropout, over
#                    a bf16 base; QLoRA and bottleneck adapters under PP2, IA3
#                    under TP2; what TP/PP cannot hold refused
#   peft_align_ranks LoRA DPO with align.reference=adapter_off over 2 and 4
#                    ranks, ZeRO-1, FSDP and TP2; QLoRA DPO, IA3 KTO, LoRA with
#                    a precomputed reference
#   online_ranks     GRPO over 2 ranks, ZeRO-1, --nproc 2 with a copy reference
#                    and a command grader; resumed mid-round (also from DP2 to
#                    one process and back); RLOO, PPO; GRPO, RLOO and PPO
#                    under TP2 (generated from the pieces), PP2, FSDP, CP2
#                    and their mixes
#   critic_ranks     PPO with a critic of its own (from a reward model and from
#                    a causal LM) over 2 ranks, ZeRO-1/2, TP2 (SP), FSDP, PP2,
#                    CP2, TP2xDP2, PP2xTP2, resumed; refusals
#   deepseek_ranks   deepseek_v3-tiny (MLA, fine-grained and shared experts,
#                    a dense first layer, aux-loss-free routing) under DP2,
#                    EP2, PP2, PP2 VP2, EP2xPP2, ZeRO-1 EP2xDP2, CP2, CP2xEP2
#                    and an EP2 checkpoint resumed on one process; deepseek_v2-tiny
#                    under EP2 and PP2
#   generate_tp_ranks  nekton generate split over 2 tensor-parallel ranks
#                    (--nproc 2 and mpirun) against one process: a Llama, a
#                    Mixtral-style model and DeepSeek-V3, batched and
#                    streamed; refusals
#   serve_tp_ranks   nekton serve split over 2 tensor-parallel ranks against
#                    a one-process server (greedy, seeded, n, logprobs,
#                    streamed, concurrent, a hung-up stream); SIGTERM;
#                    refusals
# (tests/apps/mpi/ranks_lib.sh: their shared data, model and helpers.)
foreach(script finetune_ranks align_ranks peft_finetune_ranks peft_align_ranks
               peft_model_parallel_ranks moe_ranks moe_tp_ranks moe_etp_ranks moe_cp_ranks
               deepseek_ranks online_ranks critic_ranks moe_align_ranks generate_tp_ranks
               serve_tp_ranks)
  add_test(NAME ${script}
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/apps/mpi/${script}.sh ${CMAKE_SOURCE_DIR}
                   ${CMAKE_BINARY_DIR})
  nk_timeout(t 300)
  set_tests_properties(${script} PROPERTIES LABELS mpi TIMEOUT ${t} ENVIRONMENT "${NK_MPI_ENV}")
endforeach()
# moe_ranks runs some forty short trainings (2 to 4 ranks each), moe_tp_ranks
# some thirty.
nk_timeout(t 1200)
set_tests_properties(moe_ranks PROPERTIES TIMEOUT ${t})
nk_timeout(t 600)
set_tests_properties(moe_tp_ranks PROPERTIES TIMEOUT ${t})
# finetune_ranks: some twenty runs, five of them on 4 ranks (7 min beside a
# -j2 build on 2 cores).
nk_timeout(t 900)
set_tests_properties(finetune_ranks PROPERTIES TIMEOUT ${t})
nk_timeout(t 600)
set_tests_properties(moe_etp_ranks PROPERTIES TIMEOUT ${t})
# peft_model_parallel_ranks: some thirty short trainings, six on 4 ranks.
nk_timeout(t 600)
set_tests_properties(peft_model_parallel_ranks PROPERTIES TIMEOUT ${t})
# moe_etp_split_ranks: twelve short trainings of 1 to 8 ranks, on both cores.
add_test(NAME moe_etp_split_ranks
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/apps/mpi/moe_etp_split_ranks.sh
                 ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR})
nk_timeout(t 600)
set_tests_properties(moe_etp_split_ranks PROPERTIES LABELS mpi TIMEOUT ${t} PROCESSORS 2
                     ENVIRONMENT "${NK_MPI_ENV}")
# moe_cp_ranks: some twenty trainings of 2 or 4 ranks, on both cores.
nk_timeout(t 900)
set_tests_properties(moe_cp_ranks PROPERTIES TIMEOUT ${t} PROCESSORS 2)

# Context parallel (tests/parallel/context_parallel), labelled "mpi":
#   context_parallel_mpi_np2, _np4   CP2, CP4, CP2 × DP2, CP2 × TP2 (with and
#                                    without SP) against one process (ring
#                                    attention and the all-to-all of the
#                                    heads, GQA), ZeRO-1 and FSDP over dp-cp;
#                                    CP2 × PP2 (1F1B and interleaved, GQA) and
#                                    its checkpoints resumed on one process
#                                    and back
#   context_parallel_mpi_np8         CP2 × PP2 × DP2 (interleaved), CP2 × TP2 × PP2
nk_mpi_gtest(context_parallel_mpi parallel/context_parallel nk_train 600
             ${CMAKE_SOURCE_DIR}/tests/parallel/mpi/main_mpi.cc)
target_include_directories(test_context_parallel_mpi PRIVATE ${CMAKE_SOURCE_DIR}/tests/parallel/mpi)
# CP2 × PP2 × DP2 and CP2 × TP2 × PP2: 8 ranks on 2 cores (labelled many_ranks as well).
add_test(NAME context_parallel_mpi_np8
         COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 8 --oversubscribe
                 ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_context_parallel_mpi> ${MPIEXEC_POSTFLAGS})
nk_timeout(t 600)
set_tests_properties(context_parallel_mpi_np8 PROPERTIES LABELS "mpi;many_ranks" TIMEOUT ${t}
                     ENVIRONMENT "${NK_MPI_ENV}")

# Context parallel's all_gather and hierarchical a2a+p2p attention
# (tests/parallel/cp_variants), labelled "mpi":
#   cp_variants_mpi_np2   CP2 all_gather (GQA; Gemma 2's caps and windows with
#                         full recompute; packed rows)
#   cp_variants_mpi_np4   CP4 all_gather (GQA, packed rows), CP2 × DP2 and
#                         CP2 × TP2 all_gather, CP4 a2a+p2p as 2 × 2 (GQA,
#                         packed rows)
# against one process; one thread per rank, the 4 ranks oversubscribing 2 cores.
nk_mpi_gtest(cp_variants_mpi parallel/cp_variants nk_train 300
             ${CMAKE_SOURCE_DIR}/tests/parallel/mpi/main_mpi.cc)
target_include_directories(test_cp_variants_mpi PRIVATE ${CMAKE_SOURCE_DIR}/tests/parallel/mpi)
set_tests_properties(cp_variants_mpi_np2 cp_variants_mpi_np4 PROPERTIES PROCESSORS 2)
