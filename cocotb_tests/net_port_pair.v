// Testbench wrapper (not generated): two boards' framing kernels joined by two net_channels,
// for test_transport.py. Board a: bapipe_net_t2r1 (sockets tx0 = 0, tx1 = 1, rx0 = 2);
// board b: bapipe_net_t1r2 (tx0 = 0, rx0 = 1, rx1 = 2). Streams: a.tx0 -> b.rx0 (W0-bit
// words), a.tx1 -> b.rx1 (W1), b.tx0 -> a.rx0 (W0). The UDP socket tables are modelled by
// renumbering TDEST on the way: a's socket s arrives at b as A2B(s), b's s at a as B2A(s).
`default_nettype none
module net_port_pair #(
    parameter integer W0 = 128,
    parameter integer W1 = 640,
    parameter integer BW_NUM = 20,
    parameter integer BW_DEN = 1,
    parameter integer TOKEN_W = 8,
    parameter integer LATENCY = 12,
    parameter integer PTR_W = 4,
    parameter integer HOLD_W = 5,
    parameter integer HOLD_MAX = 40,
    parameter integer P_LOSS = 0,
    parameter integer P_REORDER = 0,
    parameter integer SEED = 1
) (
    input  wire          clk,
    input  wire          rst,
    input  wire          faults_en,
    input  wire [W0-1:0] a_s_axis_tx0_tdata,
    input  wire          a_s_axis_tx0_tvalid,
    output wire          a_s_axis_tx0_tready,
    input  wire [W1-1:0] a_s_axis_tx1_tdata,
    input  wire          a_s_axis_tx1_tvalid,
    output wire          a_s_axis_tx1_tready,
    output wire [W0-1:0] a_m_axis_rx0_tdata,
    output wire          a_m_axis_rx0_tvalid,
    input  wire          a_m_axis_rx0_tready,
    input  wire [W0-1:0] b_s_axis_tx0_tdata,
    input  wire          b_s_axis_tx0_tvalid,
    output wire          b_s_axis_tx0_tready,
    output wire [W0-1:0] b_m_axis_rx0_tdata,
    output wire          b_m_axis_rx0_tvalid,
    input  wire          b_m_axis_rx0_tready,
    output wire [W1-1:0] b_m_axis_rx1_tdata,
    output wire          b_m_axis_rx1_tvalid,
    input  wire          b_m_axis_rx1_tready,
    output wire [31:0]   lost,
    output wire          overflow
);
    wire [511:0] ao_tdata, bo_tdata, ai_tdata, bi_tdata;
    wire [63:0] ao_tkeep, bo_tkeep, ai_tkeep, bi_tkeep;
    wire [15:0] ao_tdest, bo_tdest, ai_tdest, bi_tdest;
    wire ao_tlast, bo_tlast, ai_tlast, bi_tlast;
    wire ao_tvalid, bo_tvalid, ai_tvalid, bi_tvalid;
    wire ao_tready, bo_tready, ai_tready, bi_tready;
    wire [15:0] ab_dest, ba_dest;
    wire [31:0] ab_lost, ba_lost, ab_held, ba_held, ab_ack, ba_ack;
    wire ab_ack_valid, ba_ack_valid, ab_over, ba_over, a_over, b_over;

    assign lost = ab_lost + ba_lost;
    assign overflow = ab_over | ba_over | a_over | b_over;
    assign bi_tdest = (ab_dest == 16'd0) ? 16'd1 : (ab_dest == 16'd1) ? 16'd2 : 16'd0;
    assign ai_tdest = (ba_dest == 16'd0) ? 16'd2 : (ba_dest == 16'd1) ? 16'd0 : 16'd1;

    bapipe_net_t2r1 u_a (
        .clk(clk), .rst(rst),
        .s_axis_tx0_tdata(a_s_axis_tx0_tdata), .s_axis_tx0_tvalid(a_s_axis_tx0_tvalid), .s_axis_tx0_tready(a_s_axis_tx0_tready),
        .s_axis_tx1_tdata(a_s_axis_tx1_tdata), .s_axis_tx1_tvalid(a_s_axis_tx1_tvalid), .s_axis_tx1_tready(a_s_axis_tx1_tready),
        .m_axis_rx0_tdata(a_m_axis_rx0_tdata), .m_axis_rx0_tvalid(a_m_axis_rx0_tvalid), .m_axis_rx0_tready(a_m_axis_rx0_tready),
        .m_axis_line_tdata(ao_tdata), .m_axis_line_tkeep(ao_tkeep), .m_axis_line_tdest(ao_tdest),
        .m_axis_line_tlast(ao_tlast), .m_axis_line_tvalid(ao_tvalid), .m_axis_line_tready(ao_tready),
        .s_axis_line_tdata(ai_tdata), .s_axis_line_tkeep(ai_tkeep), .s_axis_line_tdest(ai_tdest),
        .s_axis_line_tlast(ai_tlast), .s_axis_line_tvalid(ai_tvalid), .s_axis_line_tready(ai_tready),
        .overflow(a_over));

    bapipe_net_t1r2 u_b (
        .clk(clk), .rst(rst),
        .s_axis_tx0_tdata(b_s_axis_tx0_tdata), .s_axis_tx0_tvalid(b_s_axis_tx0_tvalid), .s_axis_tx0_tready(b_s_axis_tx0_tready),
        .m_axis_rx0_tdata(b_m_axis_rx0_tdata), .m_axis_rx0_tvalid(b_m_axis_rx0_tvalid), .m_axis_rx0_tready(b_m_axis_rx0_tready),
        .m_axis_rx1_tdata(b_m_axis_rx1_tdata), .m_axis_rx1_tvalid(b_m_axis_rx1_tvalid), .m_axis_rx1_tready(b_m_axis_rx1_tready),
        .m_axis_line_tdata(bo_tdata), .m_axis_line_tkeep(bo_tkeep), .m_axis_line_tdest(bo_tdest),
        .m_axis_line_tlast(bo_tlast), .m_axis_line_tvalid(bo_tvalid), .m_axis_line_tready(bo_tready),
        .s_axis_line_tdata(bi_tdata), .s_axis_line_tkeep(bi_tkeep), .s_axis_line_tdest(bi_tdest),
        .s_axis_line_tlast(bi_tlast), .s_axis_line_tvalid(bi_tvalid), .s_axis_line_tready(bi_tready),
        .overflow(b_over));

    net_channel #(.BW_NUM(BW_NUM), .BW_DEN(BW_DEN), .TOKEN_W(TOKEN_W), .LATENCY(LATENCY), .PTR_W(PTR_W),
                  .HOLD_W(HOLD_W), .HOLD_MAX(HOLD_MAX), .P_LOSS(P_LOSS), .P_REORDER(P_REORDER), .SEED(SEED)) u_ab (
        .clk(clk), .rst(rst), .faults_en(faults_en),
        .s_axis_tdata(ao_tdata), .s_axis_tkeep(ao_tkeep), .s_axis_tdest(ao_tdest), .s_axis_tlast(ao_tlast),
        .s_axis_tvalid(ao_tvalid), .s_axis_tready(ao_tready),
        .m_axis_tdata(bi_tdata), .m_axis_tkeep(bi_tkeep), .m_axis_tdest(ab_dest), .m_axis_tlast(bi_tlast),
        .m_axis_tvalid(bi_tvalid), .m_axis_tready(bi_tready),
        .s_axis_ack_tdata(32'd0), .s_axis_ack_tvalid(1'b0), .m_axis_ack_tdata(ab_ack), .m_axis_ack_tvalid(ab_ack_valid),
        .lost(ab_lost), .held(ab_held), .overflow(ab_over));

    net_channel #(.BW_NUM(BW_NUM), .BW_DEN(BW_DEN), .TOKEN_W(TOKEN_W), .LATENCY(LATENCY), .PTR_W(PTR_W),
                  .HOLD_W(HOLD_W), .HOLD_MAX(HOLD_MAX), .P_LOSS(P_LOSS), .P_REORDER(P_REORDER), .SEED(SEED + 1)) u_ba (
        .clk(clk), .rst(rst), .faults_en(faults_en),
        .s_axis_tdata(bo_tdata), .s_axis_tkeep(bo_tkeep), .s_axis_tdest(bo_tdest), .s_axis_tlast(bo_tlast),
        .s_axis_tvalid(bo_tvalid), .s_axis_tready(bo_tready),
        .m_axis_tdata(ai_tdata), .m_axis_tkeep(ai_tkeep), .m_axis_tdest(ba_dest), .m_axis_tlast(ai_tlast),
        .m_axis_tvalid(ai_tvalid), .m_axis_tready(ai_tready),
        .s_axis_ack_tdata(32'd0), .s_axis_ack_tvalid(1'b0), .m_axis_ack_tdata(ba_ack), .m_axis_ack_tvalid(ba_ack_valid),
        .lost(ba_lost), .held(ba_held), .overflow(ba_over));
endmodule
`default_nettype wire
